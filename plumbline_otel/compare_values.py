"""Typed comparison of argument values: the one set of rules every analysis uses.

Conformance (`arg_equals`, `arg_matches_result`), consistency and equivalence all compare values
through `compare()`, so "equal" means the same thing in a violation, a consistency score and an
equivalence report. The rules, by declared type:

- ``identifier``: ``str(value)`` trimmed and case-folded ("INV-1029" equals " inv-1029 ").
- ``text``: as identifier, and runs of internal whitespace count as one space.
- ``number``: exact decimal equality unless a tolerance is declared (absolute ``tolerance``
  and/or relative ``rel_tolerance``). Numeric strings ("4,820.00", "$4820") parse as numbers;
  booleans are not numbers. A mismatch by a power of ten says so ("10× too large").
- ``date``: calendar dates; ISO strings, `date` and `datetime` values (a datetime's date part).
- ``datetime``: instants; naive values are taken as UTC.
- ``set``: order and duplicates ignored, elements compared by the ``element`` type.
- ``list``: order matters, elements compared by the ``element`` type.
- ``dict``: field by field (``fields`` gives a rule per field, ``ignore`` lists fields to skip);
  missing and extra fields are differences.
- ``exact``: canonical JSON equality.
- ``auto`` (the default): chosen from the expected value: bool → exact, number → number,
  date/datetime → date/datetime, str → text, list/tuple → list, set → set, dict → dict.

`Rule` is the parsed form of a declared type; specs build them from YAML mappings such as
``{type: number, tolerance: 0.005}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

ValueType = Literal["auto", "identifier", "text", "number", "date", "datetime", "set", "list", "dict", "exact"]
VALUE_TYPES: tuple[str, ...] = ("auto", "identifier", "text", "number", "date", "datetime", "set", "list", "dict", "exact")

_MISSING = object()
_SCALAR = frozenset({"identifier", "text", "exact", "date", "datetime"})


@dataclass(frozen=True)
class Rule:
    """How to compare one value: its type and, for that type, tolerances or nested rules."""

    type: ValueType = "auto"
    tolerance: float = 0.0  # absolute, for numbers
    rel_tolerance: float = 0.0  # relative to the expected value, for numbers
    element: Rule | None = None  # for set and list
    fields: Mapping[str, Rule] = field(default_factory=dict)  # for dict
    ignore: frozenset[str] = frozenset()  # dict fields that never differ

    def describe(self) -> dict[str, Any]:
        """A canonical, JSON-ready description (part of a spec's hash)."""
        out: dict[str, Any] = {"type": self.type}
        if self.tolerance:
            out["tolerance"] = self.tolerance
        if self.rel_tolerance:
            out["rel_tolerance"] = self.rel_tolerance
        if self.element is not None:
            out["element"] = self.element.describe()
        if self.fields:
            out["fields"] = {k: self.fields[k].describe() for k in sorted(self.fields)}
        if self.ignore:
            out["ignore"] = sorted(self.ignore)
        return out


def rule_from(spec: Any) -> Rule:
    """Build a `Rule` from a type name or a mapping; raises ValueError naming what is wrong."""
    if spec is None:
        return Rule()
    if isinstance(spec, Rule):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"a comparison rule is a type name or a mapping, not {type(spec).__name__}")
    unknown = set(spec) - {"type", "tolerance", "rel_tolerance", "element", "fields", "ignore"}
    if unknown:
        raise ValueError(f"unknown comparison option(s): {', '.join(sorted(map(str, unknown)))}")
    kind = spec.get("type", "auto")
    if kind not in VALUE_TYPES:
        raise ValueError(f"unknown type {kind!r} (known: {', '.join(VALUE_TYPES)})")
    tol, rel = spec.get("tolerance", 0.0), spec.get("rel_tolerance", 0.0)
    for name, val in (("tolerance", tol), ("rel_tolerance", rel)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0:
            raise ValueError(f"{name} must be a non-negative number, got {val!r}")
    fields = spec.get("fields") or {}
    if not isinstance(fields, Mapping):
        raise ValueError("fields must be a mapping of field name to rule")
    ignore = spec.get("ignore") or []
    if isinstance(ignore, str) or not isinstance(ignore, (list, tuple, set, frozenset)):
        raise ValueError("ignore must be a list of field names")
    return Rule(
        type=kind,
        tolerance=float(tol),
        rel_tolerance=float(rel),
        element=rule_from(spec["element"]) if spec.get("element") is not None else None,
        fields={str(k): rule_from(v) for k, v in fields.items()},
        ignore=frozenset(str(i) for i in ignore),
    )


_RULES: dict[str, Rule] = {k: Rule(type=k) for k in VALUE_TYPES}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Difference:
    """One place where two values differ; ``path`` is "" for the value itself, else "a.b[2]"."""

    path: str
    expected: Any
    got: Any
    detail: str


@dataclass(frozen=True)
class Comparison:
    """The outcome of `compare`: equal, or the differences found (first one first)."""

    differences: tuple[Difference, ...] = ()

    @property
    def equal(self) -> bool:
        """True when no difference was found."""
        return not self.differences

    @property
    def detail(self) -> str:
        """A one-line explanation, empty when equal."""
        return "; ".join(d.detail for d in self.differences[:3]) + (
            f"; and {len(self.differences) - 3} more" if len(self.differences) > 3 else ""
        )

    def __bool__(self) -> bool:
        return self.equal


def compare(expected: Any, got: Any, rule: Rule | str | Mapping[str, Any] | None = None) -> Comparison:
    """Compare `got` against `expected` under `rule` (default: ``auto``)."""
    return Comparison(tuple(_diff(expected, got, rule_from(rule), "")))


def equal(expected: Any, got: Any, rule: Rule | str | Mapping[str, Any] | None = None) -> bool:
    """``compare(...).equal``, without building the explanation (the hot path of conditions)."""
    r = rule_from(rule)
    kind = _resolve(r, expected)
    if kind in _SCALAR:
        return bool(_canon(expected, _RULES[kind]) == _canon(got, _RULES[kind]))
    if kind == "number":
        e, g = to_number(expected), to_number(got)
        if e is not None and g is not None and (e == g or not (r.tolerance or r.rel_tolerance)):
            return e == g
    return compare(expected, got, r).equal


class Matcher:
    """`equal` against one fixed expected value, canonicalised once (for conditions run per trajectory)."""

    __slots__ = ("expected", "rule", "_kind", "_canon")

    def __init__(self, expected: Any, rule: Rule | str | Mapping[str, Any] | None = None) -> None:
        self.expected = expected
        self.rule = rule_from(rule)
        self._kind = _resolve(self.rule, expected)
        self._canon = _canon(expected, _RULES[self._kind]) if self._kind in _SCALAR else None

    def __call__(self, got: Any) -> bool:
        if self._canon is not None:
            return bool(self._canon == _canon(got, _RULES[self._kind]))
        return equal(self.expected, got, self.rule)


def canonical(value: Any, rule: Rule | str | Mapping[str, Any] | None = None) -> str:
    """A string that is equal for values `compare` calls equal without tolerance.

    Used to group values (modal arguments in consistency); numbers with a tolerance group by
    their exact value, so grouping is never looser than comparison.
    """
    return json.dumps(_canon(value, rule_from(rule)), sort_keys=True, separators=(",", ":"), default=str)


# ---------------------------------------------------------------------------------------------
# implementation


def _resolve(rule: Rule, expected: Any) -> str:
    if rule.type != "auto":
        return rule.type
    if isinstance(expected, bool) or expected is None:
        return "exact"
    if isinstance(expected, (int, float, Decimal)):
        return "number"
    if isinstance(expected, datetime):
        return "datetime"
    if isinstance(expected, date):
        return "date"
    if isinstance(expected, str):
        return "text"
    if isinstance(expected, Mapping):
        return "dict"
    if isinstance(expected, (set, frozenset)):
        return "set"
    if isinstance(expected, (list, tuple)):
        return "list"
    return "exact"


def _diff(expected: Any, got: Any, rule: Rule, path: str) -> list[Difference]:
    kind = _resolve(rule, expected)
    if kind == "dict":
        return _diff_dict(expected, got, rule, path)
    if kind in ("list", "set"):
        return _diff_seq(expected, got, rule, path, ordered=kind == "list")
    if kind == "number":
        detail = _number_detail(expected, got, rule)
    else:
        ok = _canon(expected, Rule(type=kind)) == _canon(got, Rule(type=kind))  # type: ignore[arg-type]
        detail = None if ok else f"expected {_show(expected)}, got {_show(got)}"
        if detail and kind in ("date", "datetime") and _to_when(got, kind) is None:
            detail += f" (not a {kind})"
    if detail is None:
        return []
    where = f"{path}: " if path else ""
    return [Difference(path, expected, got, where + detail)]


def _diff_dict(expected: Any, got: Any, rule: Rule, path: str) -> list[Difference]:
    if not isinstance(expected, Mapping) or not isinstance(got, Mapping):
        if _canon(expected, Rule(type="exact")) == _canon(got, Rule(type="exact")):
            return []
        return [Difference(path, expected, got, f"{path + ': ' if path else ''}expected {_show(expected)}, got {_show(got)}")]
    out: list[Difference] = []
    for key in sorted(set(expected) | set(got), key=str):
        if str(key) in rule.ignore:
            continue
        sub = f"{path}.{key}" if path else str(key)
        e, g = expected.get(key, _MISSING), got.get(key, _MISSING)
        if e is _MISSING:
            out.append(Difference(sub, None, g, f"{sub}: unexpected field ({_show(g)})"))
        elif g is _MISSING:
            out.append(Difference(sub, e, None, f"{sub}: missing (expected {_show(e)})"))
        else:
            out.extend(_diff(e, g, rule.fields.get(str(key), Rule()), sub))
    return out


def _diff_seq(expected: Any, got: Any, rule: Rule, path: str, ordered: bool) -> list[Difference]:
    elem = rule.element or Rule()
    exp, gv = _as_list(expected), _as_list(got)
    where = f"{path}: " if path else ""
    if ordered:
        if len(exp) != len(gv):
            return [Difference(path, expected, got, f"{where}expected {len(exp)} items, got {len(gv)}")]
        out: list[Difference] = []
        for i, (e, g) in enumerate(zip(exp, gv)):
            out.extend(_diff(e, g, elem, f"{path}[{i}]"))
        return out
    # Sets: two elements are the same when compare() calls them equal (so tolerances hold).
    missing = [e for e in exp if not any(not _diff(e, g, elem, "") for g in gv)]
    extra = [g for g in gv if not any(not _diff(e, g, elem, "") for e in exp)]
    if not missing and not extra:
        return []
    parts = []
    if missing:
        parts.append("missing " + ", ".join(_show(m) for m in missing))
    if extra:
        parts.append("unexpected " + ", ".join(_show(x) for x in extra))
    return [Difference(path, expected, got, where + "; ".join(parts))]


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if value is None:
        return []
    return [value]


_NUMERIC = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_GROUPED = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
_CURRENCY = "$£€¥"


def to_number(value: Any) -> Decimal | None:
    """Parse a value as an exact decimal: numbers and numeric strings; None when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        sign = ""
        if text[:1] in "+-" and text[:1]:
            sign, text = text[0], text[1:].strip()
        text = text.lstrip(_CURRENCY).strip()
        if _GROUPED.match(text):
            text = text.replace(",", "")
        if _NUMERIC.match(text):
            try:
                return Decimal(sign + text)
            except InvalidOperation:
                return None
    return None


def _number_detail(expected: Any, got: Any, rule: Rule) -> str | None:
    e, g = to_number(expected), to_number(got)
    if e is None or g is None:
        if e is None and g is None and _canon(expected, Rule(type="exact")) == _canon(got, Rule(type="exact")):
            return None
        which = "expected value" if e is None else "value"
        return f"expected {_show(expected)}, got {_show(got)} ({which} is not a number)"
    if e == g:
        return None
    gap = abs(e - g)
    if rule.tolerance and gap <= Decimal(repr(rule.tolerance)):
        return None
    if rule.rel_tolerance and gap <= Decimal(repr(rule.rel_tolerance)) * abs(e):
        return None
    detail = f"expected {_show_num(expected)}, got {_show_num(got)}"
    scale = _power_of_ten(e, g)
    if scale:
        detail += f" ({scale})"
    elif rule.tolerance or rule.rel_tolerance:
        detail += f" (off by {_fmt(gap)}, beyond the tolerance)"
    else:
        detail += f" (off by {_fmt(gap)})"
    return detail


def _power_of_ten(e: Decimal, g: Decimal) -> str | None:
    """'10× too large' when g is e times a power of ten (within rounding), else None."""
    if e == 0 or g == 0 or (e < 0) != (g < 0):
        return None
    ratio = float(abs(g) / abs(e))
    exp = round(math.log10(ratio))
    if exp == 0 or abs(ratio / 10.0**exp - 1) > 1e-6:
        return None
    factor = f"{10 ** abs(exp):,}".replace(",", "")
    return f"{factor}× too large" if exp > 0 else f"{factor}× too small"


def _fmt(d: Decimal) -> str:
    return format(d.normalize(), "f") if d == d.to_integral() else format(d, "f")


def parse_iso(text: str) -> datetime | None:
    """An ISO 8601 time (``Z`` read as UTC, a naive time taken as UTC), or None when `text` is not one: the one reading
    of times that `--since` and typed comparison share."""
    text = text.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _to_when(value: Any, kind: str) -> date | datetime | None:
    if isinstance(value, datetime):
        dt = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    elif isinstance(value, date):
        return value if kind == "date" else datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    elif isinstance(value, str):
        parsed = parse_iso(value)
        if parsed is None:
            return None
        dt = parsed
    else:
        return None
    return dt.date() if kind == "date" else dt


def _canon(value: Any, rule: Rule) -> Any:
    kind = _resolve(rule, value)
    if kind in ("identifier", "text"):
        if value is None:
            return None
        text = str(value).strip().casefold()
        return " ".join(text.split()) if kind == "text" else text
    if kind == "number":
        num = to_number(value)
        return ("num", _fmt(num)) if num is not None else _canon(value, Rule(type="exact"))
    if kind in ("date", "datetime"):
        when = _to_when(value, kind)
        if when is None:
            return _canon(value, Rule(type="exact"))
        return (kind, when.astimezone(timezone.utc).isoformat() if isinstance(when, datetime) else when.isoformat())
    if kind == "dict" and isinstance(value, Mapping):
        return {
            str(k): _canon(v, rule.fields.get(str(k), Rule()))
            for k, v in value.items()
            if str(k) not in rule.ignore
        }
    if kind in ("list", "set") and isinstance(value, (list, tuple, set, frozenset)):
        items = [_canon(v, rule.element or Rule()) for v in _as_list(value)]
        if kind == "set":
            items = sorted({json.dumps(i, sort_keys=True, default=str) for i in items})
        return items
    if isinstance(value, (list, tuple)):
        return [_canon(v, Rule(type="exact")) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canon(v, Rule(type="exact")) for k, v in value.items()}
    if isinstance(value, float) and value == int(value) and math.isfinite(value):
        return int(value) if abs(value) < 2**53 else value
    return value


def _show_num(value: Any) -> str:
    return value.strip() if isinstance(value, str) else _show(value)


def _show(value: Any) -> str:
    if isinstance(value, (Decimal, int, float)) and not isinstance(value, bool):
        return str(value)
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
