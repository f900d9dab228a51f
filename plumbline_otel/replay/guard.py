"""The semantic-equivalence guard: a text variant must keep every fact that decides the task.

Pure and deterministic (no model): the protected tokens of a text are its identifier-like tokens
(anything mixing letters and digits, or snake_case: ``INV-1029``, ``PO-4471``, ``NW-40112``),
currencies (``GBP``, ``£``), dates (ISO, ``20 February 2026``, ``Feb 20, 2026``, ``20/02/2026``)
and amounts (``4,820.00``, ``95``, ``2.5%``). A variant passes when it has exactly the original's
set of each kind: nothing dropped, nothing changed, nothing new. Comparison is on normalised
values, so ``inv-1029`` equals ``INV-1029`` and ``4,820.00`` equals ``4820.00``, but ``4,280.00``
or ``48,200.00`` do not.

It cannot see a reworded instruction ("pay" becoming "hold"); that is what the wording templates
are restricted for, and what a model-based guard would add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

_MONTHS = {name: i for i, names in enumerate(
    [(), ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")]) for name in names}
_MONTH = r"(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DATE_PATTERNS = [
    re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b"),
    re.compile(r"\b(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<y>\d{4}|\d{2})\b"),
    re.compile(r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r"(?:,?\s+(?P<y>\d{4}))?\b", re.I),
    re.compile(r"\b" + _MONTH + r"\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(?P<y>\d{4}))?\b", re.I),
]
_CURRENCY_CODES = {"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "NZD", "CNY", "INR", "SEK", "NOK", "DKK", "PLN", "CZK"}
_CURRENCY_SYMBOLS = {"£": "GBP", "€": "EUR", "$": "USD", "¥": "JPY"}
_WORD = re.compile(r"(?<![\w])[A-Za-z0-9]+(?:[-_/.][A-Za-z0-9]+)*(?![\w])")
_NUMBER = re.compile(r"(?<![\w.,])(?P<n>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?P<pct>\s?%)?(?![\w])")
KINDS = ("identifier", "currency", "date", "amount")


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def _dates(text: str) -> tuple[set[str], str]:
    found: set[str] = set()
    for pattern in _DATE_PATTERNS:
        for m in list(pattern.finditer(text)):
            g = m.groupdict()
            if "a" in g and g.get("a"):
                found.add(f"{int(g['a'])}/{int(g['b'])}/{g['y']}")  # d/m or m/d: kept as written
            else:
                month = int(g["m"]) if g.get("m") else _MONTHS[g["mon"].lower().rstrip(".")]
                day = int(g["d"])
                if not (1 <= month <= 12 and 1 <= day <= 31):
                    continue
                found.add(f"{g['y'] or '????'}-{month:02d}-{day:02d}")
            text = _blank(text, m.start(), m.end())
    return found, text


def _amount(raw: str) -> str | None:
    try:
        value = Decimal(raw.replace(",", ""))
    except InvalidOperation:
        return None
    text = format(value.normalize(), "f")
    return text


def protected_tokens(text: str) -> dict[str, frozenset[str]]:
    """The normalised protected tokens of ``text``, by kind (see module docstring)."""
    dates, rest = _dates(text)
    identifiers: set[str] = set()
    currencies: set[str] = set()
    for m in list(_WORD.finditer(rest)):
        word = m.group(0)
        has_digit = any(c.isdigit() for c in word)
        has_alpha = any(c.isalpha() for c in word)
        if word.upper() in _CURRENCY_CODES and word.isupper():
            currencies.add(word.upper())
            rest = _blank(rest, m.start(), m.end())
        elif (has_digit and has_alpha) or ("_" in word and has_alpha):
            identifiers.add(word.upper())
            rest = _blank(rest, m.start(), m.end())
    for symbol, code in _CURRENCY_SYMBOLS.items():
        if symbol in rest:
            currencies.add(code)
    amounts: set[str] = set()
    for m in _NUMBER.finditer(rest):
        value = _amount(m.group("n"))
        if value is not None:
            amounts.add(value + ("%" if m.group("pct") else ""))
    return {"identifier": frozenset(identifiers), "currency": frozenset(currencies),
            "date": frozenset(dates), "amount": frozenset(amounts)}


@dataclass(frozen=True)
class GuardVerdict:
    """Whether a variant kept the task's meaning, and if not, what changed."""

    ok: bool
    missing: tuple[str, ...] = ()  # "amount 4820" etc.: in the original, not in the variant
    added: tuple[str, ...] = ()  # in the variant, not in the original

    @property
    def reason(self) -> str | None:
        if self.ok:
            return None
        parts = []
        if self.missing:
            parts.append("dropped or changed " + ", ".join(self.missing))
        if self.added:
            parts.append("introduced " + ", ".join(self.added))
        return "; ".join(parts)


def check_equivalent(original: str, variant: str) -> GuardVerdict:
    """Accept ``variant`` only if it has exactly ``original``'s protected tokens of every kind."""
    before, after = protected_tokens(original), protected_tokens(variant)
    missing = tuple(f"{kind} {tok}" for kind in KINDS for tok in sorted(before[kind] - after[kind]))
    added = tuple(f"{kind} {tok}" for kind in KINDS for tok in sorted(after[kind] - before[kind]))
    return GuardVerdict(not missing and not added, missing, added)
