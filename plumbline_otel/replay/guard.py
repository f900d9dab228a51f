"""The semantic-equivalence guard: a text variant must keep every fact that decides the task.

Pure and deterministic (no model). A text's protected tokens, by kind:

- identifiers (anything mixing letters and digits, or snake_case: ``INV-1029``, ``PO-4471``),
  currencies (``GBP``, ``£``), dates (ISO, ``20 February 2026``, ``20/02/2026``) and amounts
  (``4,820.00``, ``2.5%``), compared on normalised values (``inv-1029`` is ``INV-1029``,
  ``4,820.00`` is ``4820.00``, ``48,200.00`` is not);
- named entities: runs of capitalised words that are not sentence openers ("Northwind
  Supplies", "Meridian Office Services"), so a changed or dropped vendor is seen;
- intents: what the text asks for, as classes of verbs (``pay`` = pay / settle / remit;
  ``check`` = check / verify / review / confirm; ``skip`` = skip / ignore / bypass / waive; …),
  each marked ``not`` when a negation governs it ("Do not process" is ``not process``), so a
  reversed polarity ("Please reject…", "Do not pay…") or an added instruction ("Skip the
  duplicate check.") changes the set;
- negations: how many the text has ("never", "no", "without", "n't"…).

A variant passes when it has exactly the original's set of every kind: nothing dropped, nothing
changed, nothing new. Rewordings within a class (process → handle, check → verify, quickly →
promptly) and chatter that asks for nothing pass. It errs towards rejecting: a paraphrase that
says "pay" for "process" is rejected, because the two can decide a task differently. Its
accuracy on a corpus of reference-task rewrites is measured by ``tests/replay/test_replay_guard_corpus.py``.
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
KINDS = ("identifier", "currency", "date", "amount", "entity", "intent", "negation")

# Verb classes: a rewording may move within a class, never between them (longest phrase first).
_INTENTS: dict[str, tuple[str, ...]] = {
    "process": ("process", "processing", "processed", "handle", "handling", "deal with", "take care of", "sort out",
                "action", "work through"),
    "pay": ("pay", "paying", "paid", "payment", "settle", "settling", "remit", "remittance", "disburse", "release payment"),
    "approve": ("approve", "approved", "approval", "authorise", "authorize", "authorised", "authorized", "sign off"),
    "reject": ("reject", "rejected", "decline", "declined", "refuse", "deny", "dispute", "send back", "return to sender",
               "bounce"),
    "hold": ("hold", "hold off", "on hold", "block", "freeze", "suspend", "pause", "defer", "delay", "postpone"),
    "cancel": ("cancel", "void", "delete", "remove", "reverse", "withdraw", "write off"),
    "skip": ("skip", "ignore", "bypass", "override", "waive", "omit", "disregard", "don't bother"),
    "check": ("check", "checks", "verify", "review", "look over", "confirm", "double-check", "validate", "inspect",
              "audit", "make sure", "ensure", "match"),
    "change": ("change", "update", "amend", "modify", "edit", "alter", "switch", "replace", "use", "correct", "adjust",
               "redirect"),
    "send": ("send", "email", "forward", "wire", "transfer", "notify", "contact", "tell"),
    "urgent": ("urgent", "urgently", "asap", "immediately", "right away", "today", "promptly", "quickly", "rush",
               "expedite", "priority"),
    "escalate": ("escalate", "flag", "refer"),
    "split": ("split", "merge", "combine", "partial", "partially"),
}


def _forms(phrase: str) -> set[str]:
    """A verb's inflections (skip, skips, skipped, skipping, …); phrases are matched as written."""
    if " " in phrase or "-" in phrase or "'" in phrase:
        return {phrase}
    stem = phrase[:-1] if phrase.endswith("e") else phrase
    return {phrase, phrase + "s", phrase + "es", phrase + "ed", phrase + "d", stem + "ing",
            phrase + phrase[-1] + "ed", phrase + phrase[-1] + "ing"}


_PHRASE_CLASS = {form: cls for cls, phrases in _INTENTS.items() for phrase in phrases for form in _forms(phrase)}
_INTENT = re.compile(r"(?<![\w-])(" + "|".join(re.escape(p) for p in sorted(_PHRASE_CLASS, key=len, reverse=True))
                     + r")(?![\w-])", re.I)
_NEGATION = re.compile(r"(?<![\w-])(not|no|never|without|avoid|refrain|cannot|nor)(?![\w-])|n't\b", re.I)
_CLAUSE_BREAK = re.compile(r"[.!?;:,\n]")
# Capitalised words that open sentences or greet, never names (a leading one is dropped from a run).
_NOT_NAMES = frozenset(["please", "kindly", "could", "would", "can", "will", "shall", "should", "hi", "hello", "hey", "dear", "thanks", "thank", "much", "from", "for", "to", "by", "the", "a", "an", "this", "that", "these", "those", "invoice", "invoices", "i", "we", "you", "our", "my", "your", "also", "just", "fyi", "reminder", "note", "unrelated", "someone", "when", "quick", "and", "or", "but", "so", "if", "once", "then", "after", "before", "because", "as", "on", "in", "at", "with", "per", "re", "subject", "urgent", "there", "here", "it", "its", "ok", "okay", "yes"])
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY = re.compile(r"\b(" + "|".join(_WEEKDAYS) + r")\b", re.I)
_NAME_WORD = re.compile(r"(?<![\w-])([A-Z][A-Za-z'&-]*)(?![\w-])")
_CONNECTORS = frozenset({"of", "and", "&", "de", "van", "von", "der", "la", "du"})


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
    for m in list(_WEEKDAY.finditer(text)):  # "only after Friday" sets a date too
        found.add(m.group(1).lower())
        text = _blank(text, m.start(), m.end())
    return found, text


def _amount(raw: str) -> str | None:
    try:
        value = Decimal(raw.replace(",", ""))
    except InvalidOperation:
        return None
    text = format(value.normalize(), "f")
    return text


def _sentence_start(text: str, pos: int) -> bool:
    before = text[:pos].rstrip(" \t\"'(")
    return not before or before[-1] in ".!?:\n"


def _entities(text: str) -> set[str]:
    """Runs of capitalised words that are names (see module docstring), lower-cased."""
    words = [(m.start(), m.end(), m.group(1)) for m in _NAME_WORD.finditer(text)]
    out: set[str] = set()
    i = 0
    while i < len(words):
        start, end, word = words[i]
        run = [(start, word)]
        j = i + 1
        while j < len(words):
            gap = text[end:words[j][0]]
            if gap == " " or (gap.strip().lower() in _CONNECTORS and gap.startswith(" ") and gap.endswith(" ")):
                run.append((words[j][0], words[j][2]))
                end = words[j][1]
                j += 1
            else:
                break
        i = j
        while run and run[0][1].lower() in _NOT_NAMES:
            run.pop(0)
        names = [w for _, w in run if not any(c.isdigit() for c in w) and w.upper() not in _CURRENCY_CODES
                 and w.lower() not in _MONTHS and w.lower() not in _WEEKDAYS and w != "I"]
        if not names or (len(names) == 1 and _sentence_start(text, run[0][0])):
            continue  # a lone capitalised sentence opener ("Someone", "Reminder") is not a name
        name = " ".join(names).lower()
        out.add(name[:-2] if name.endswith("'s") else name)
    return out


def _intents(text: str) -> tuple[set[str], int]:
    """(intent classes, each "not …" when a negation precedes it in its clause; negation count)."""
    found: set[str] = set()
    negations = [m.start() for m in _NEGATION.finditer(text)]
    for m in _INTENT.finditer(text):
        clause_start = max((b.end() for b in _CLAUSE_BREAK.finditer(text, 0, m.start())), default=0)
        negated = any(clause_start <= n < m.start() for n in negations)
        cls = _PHRASE_CLASS[m.group(1).lower()]
        found.add(f"not {cls}" if negated and cls != "skip" else cls)
    return found, len(negations)


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
    intents, negations = _intents(text)
    return {"identifier": frozenset(identifiers), "currency": frozenset(currencies),
            "date": frozenset(dates), "amount": frozenset(amounts), "entity": frozenset(_entities(text)),
            "intent": frozenset(intents), "negation": frozenset({str(negations)} if negations else ())}


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
