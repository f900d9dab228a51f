"""The built-in invariant kinds, each a small frozen callable registered under its YAML key.

Semantics shared by every kind ("a failed call did not happen"): a tool step with an error is
treated as absent. It never satisfies `must_call`, never licenses an `ordering`, never counts
toward `call_at_least`, and, by the same rule, does not count toward `must_not_call`,
`call_at_most` or the `then` side of an `ordering` either. Those three take ``count_failed:
true`` for the stricter reading in which an attempt is already a breach.

Applicability (kept honest so rates are not inflated): argument checks are `not_applicable`
when the tool was never successfully called, when no call carried the argument in a captured
form (arguments absent, unparsed or redacted by the exporter), or when the ground truth they
compare with is absent from the context; an `ordering` is `not_applicable` when its later
tool never ran. `must_call`, `must_not_call` and the count kinds always apply (their `when`
aside).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from plumbline_otel.compare_values import Rule, compare, equal, rule_from
from plumbline_otel.model import Step, Trajectory
from plumbline_otel.spec._steps import MISSING, UNAVAILABLE, arg, calls, field_of, is_handoff
from plumbline_otel.spec._verdict import Invariant, Verdict

Predicate = Callable[[Any, Step, Trajectory, Mapping[str, Any]], bool]
Builder = Callable[[Any, Mapping[str, Predicate]], Invariant]

KINDS: dict[str, Builder] = {}


def register_kind(name: str, builder: Builder) -> None:
    """Make `name` a key the YAML spec accepts; `builder(params, predicates)` returns an Invariant.

    The builder raises ValueError with a reason when the params are wrong; the loader adds the
    file and line.
    """
    if name in KINDS:
        raise ValueError(f"invariant kind {name!r} is already registered")
    KINDS[name] = builder


def kind(name: str) -> Callable[[Builder], Builder]:
    """Decorator form of `register_kind`."""

    def deco(builder: Builder) -> Builder:
        register_kind(name, builder)
        return builder

    return deco


def _label(step: Step, index: int) -> str:
    return f"{step.name} at step {index}"


# --------------------------------------------------------------------------------------------
# call presence and counts


@dataclass(frozen=True)
class MustCall:
    """`tool` was called at least once and the call did not fail."""

    tool: str

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        if calls(trajectory, self.tool):
            return Verdict.ok()
        failed = len(calls(trajectory, self.tool, include_failed=True))
        why = f" ({failed} call(s), all failed)" if failed else ""
        return Verdict.fail(f"{self.tool} was never successfully called{why}", None, self.tool)

    def describe(self) -> dict[str, Any]:
        return {"must_call": self.tool}


@dataclass(frozen=True)
class MustNotCall:
    """`tool` was never (successfully, unless `count_failed`) called."""

    tool: str
    count_failed: bool = False

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        found = calls(trajectory, self.tool, include_failed=self.count_failed)
        if not found:
            return Verdict.ok()
        i = found[0]
        failed = " (the call failed)" if trajectory.steps[i].error is not None else ""
        return Verdict.fail(f"{self.tool} called at step {i}{failed}; it must not be", i, self.tool)

    def describe(self) -> dict[str, Any]:
        return {"must_not_call": {"tool": self.tool, "count_failed": self.count_failed}}


@dataclass(frozen=True)
class CallAtMost:
    """`tool` was called at most `n` times; the violation sits at call n+1."""

    tool: str
    n: int
    count_failed: bool = False

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        found = calls(trajectory, self.tool, include_failed=self.count_failed)
        if len(found) <= self.n:
            return Verdict.ok()
        i = found[self.n]
        return Verdict.fail(f"{self.tool} called {len(found)} times, at most {self.n} allowed", i, self.tool)

    def describe(self) -> dict[str, Any]:
        return {"call_at_most": {"tool": self.tool, "n": self.n, "count_failed": self.count_failed}}


@dataclass(frozen=True)
class CallAtLeast:
    """`tool` was successfully called at least `n` times."""

    tool: str
    n: int

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        found = calls(trajectory, self.tool)
        if len(found) >= self.n:
            return Verdict.ok()
        return Verdict.fail(f"{self.tool} succeeded {len(found)} times, at least {self.n} required", None, self.tool)

    def describe(self) -> dict[str, Any]:
        return {"call_at_least": {"tool": self.tool, "n": self.n}}


@dataclass(frozen=True)
class Ordering:
    """Each tool in `tools` runs (successfully) before every call of the next one.

    ``[A, B]`` means every B is preceded by a successful A; since the first B is the hardest
    to satisfy, this is "a successful A happens before the first B", and a B that comes first
    is the violation whatever follows. Longer lists chain: [A, B, C] is A before B and B before
    C. Not applicable when no later tool in the chain ran.
    """

    tools: tuple[str, ...]
    count_failed: bool = False

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        applied = False
        for first, then in zip(self.tools, self.tools[1:]):
            later = calls(trajectory, then, include_failed=self.count_failed)
            if not later:
                continue
            applied = True
            earlier = calls(trajectory, first)
            b = later[0]
            if earlier and earlier[0] < b:
                continue
            return Verdict.fail(self._why(trajectory, first, then, b), b, then)
        return Verdict.ok() if applied else Verdict.na(f"{', '.join(self.tools[1:])} never called")

    @staticmethod
    def _why(trajectory: Trajectory, first: str, then: str, b: int) -> str:
        tried = [i for i in calls(trajectory, first, include_failed=True) if i < b]
        detail = f"{then} at step {b} before any successful {first}"
        if tried:
            detail += f" ({first} at step {tried[0]} failed)"
        return detail

    def describe(self) -> dict[str, Any]:
        return {"ordering": {"tools": list(self.tools), "count_failed": self.count_failed}}


# --------------------------------------------------------------------------------------------
# arguments


def _check_calls(
    trajectory: Trajectory,
    tool: str,
    name: str,
    judge: Callable[[int, Step, Any], Verdict],
) -> Verdict:
    """Run `judge` on each successful call of `tool` that carries argument `name` in a captured form.

    The first failing call decides; with no judged call the verdict is not_applicable.
    """
    found = calls(trajectory, tool)
    if not found:
        return Verdict.na(f"{tool} never successfully called")
    judged = unavailable = 0
    last_na: Verdict | None = None
    for i in found:
        step = trajectory.steps[i]
        value = arg(step, name)
        if value is UNAVAILABLE:
            unavailable += 1
            continue
        if value is MISSING:
            return Verdict.fail(f"{_label(step, i)} called without {name}", i, step.name)
        verdict = judge(i, step, value)
        if verdict.status == "fail":
            return verdict
        if verdict.status == "not_applicable":
            last_na = verdict
            continue
        judged += 1
    if judged:
        note = f" ({unavailable} call(s) without captured arguments)" if unavailable else ""
        return Verdict.ok(f"{judged} call(s) checked{note}")
    return last_na or Verdict.na(f"arguments of {tool} not captured")


@dataclass(frozen=True)
class ArgEquals:
    """Every successful call of `tool` passes `arg` equal (typed) to `value` or `context[from_context]`."""

    tool: str
    arg: str
    value: Any = None
    from_context: str | None = None
    rule: Rule = dc_field(default_factory=Rule)

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        if self.from_context is not None:
            if self.from_context not in context:
                return Verdict.na(f"no ground truth for {self.from_context}")
            expected = context[self.from_context]
        else:
            expected = self.value

        def judge(i: int, step: Step, got: Any) -> Verdict:
            if equal(expected, got, self.rule):
                return Verdict.ok()
            detail = compare(expected, got, self.rule).detail
            return Verdict.fail(f"{_label(step, i)}: {self.arg} {detail}", i, step.name)

        return _check_calls(trajectory, self.tool, self.arg, judge)

    def describe(self) -> dict[str, Any]:
        src = {"from_context": self.from_context} if self.from_context is not None else {"value": self.value}
        return {"arg_equals": {"tool": self.tool, "arg": self.arg, **src, **self.rule.describe()}}


@dataclass(frozen=True)
class ArgSatisfies:
    """Every successful call of `tool` passes `arg` for which the named domain predicate holds."""

    tool: str
    arg: str
    predicate: str
    fn: Predicate = dc_field(compare=False, repr=False)

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        def judge(i: int, step: Step, got: Any) -> Verdict:
            try:
                held = self.fn(got, step, trajectory, context)
            except Exception as exc:  # domain code: reported apart, never as a pass or a fail
                err = f"predicate {self.predicate} raised {type(exc).__name__}: {exc}"
                return Verdict("not_applicable", err, i, step.name, error=err)
            if held:
                return Verdict.ok()
            return Verdict.fail(f"{_label(step, i)}: {self.arg}={got!r} fails {self.predicate}", i, step.name)

        return _check_calls(trajectory, self.tool, self.arg, judge)

    def describe(self) -> dict[str, Any]:
        return {"arg_satisfies": {"tool": self.tool, "arg": self.arg, "predicate": self.predicate}}


@dataclass(frozen=True)
class ArgMatchesResult:
    """`tool`'s `arg` equals `field` of the latest earlier successful `result_tool` result.

    A call with no earlier successful `result_tool` fails (the value it relies on was never
    obtained); a call whose source result was not captured, or lacks the field, is not judged.
    """

    tool: str
    arg: str
    result_tool: str
    field: str
    rule: Rule = dc_field(default_factory=Rule)

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        sources = calls(trajectory, self.result_tool)

        def judge(i: int, step: Step, got: Any) -> Verdict:
            before = [s for s in sources if s < i]
            if not before:
                return Verdict.fail(f"{_label(step, i)}: no successful {self.result_tool} before it", i, step.name)
            expected = field_of(trajectory.steps[before[-1]].result, self.field)
            if expected is UNAVAILABLE or expected is MISSING:
                what = "not captured" if expected is UNAVAILABLE else f"has no {self.field}"
                return Verdict.na(f"result of {self.result_tool} at step {before[-1]} {what}")
            if equal(expected, got, self.rule):
                return Verdict.ok()
            detail = compare(expected, got, self.rule).detail
            src = f"{self.result_tool}.{self.field} at step {before[-1]}"
            return Verdict.fail(f"{_label(step, i)}: {self.arg} {detail} (from {src})", i, step.name)

        return _check_calls(trajectory, self.tool, self.arg, judge)

    def describe(self) -> dict[str, Any]:
        return {
            "arg_matches_result": {
                "tool": self.tool,
                "arg": self.arg,
                "result_tool": self.result_tool,
                "field": self.field,
                **self.rule.describe(),
            }
        }


# --------------------------------------------------------------------------------------------
# builders from YAML params


def _mapping(params: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"expects a mapping with {', '.join(required)}")
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    unknown = set(params) - set(required) - set(optional)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(sorted(map(str, unknown)))}")
    for k in ("tool", "arg", "result_tool", "field", "from_context", "predicate"):
        if k in params and (not isinstance(params[k], str) or not params[k].strip()):
            raise ValueError(f"{k} must be a non-empty string")
    return params


def _tool(params: Any) -> str:
    if isinstance(params, str) and params.strip():
        return params
    return str(_mapping(params, ("tool",), ("count_failed",))["tool"])


def _count(params: Any) -> tuple[str, int, bool]:
    p = _mapping(params, ("tool", "n"), ("count_failed",))
    n = p["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    return p["tool"], n, _flag(p)


def _flag(params: Any) -> bool:
    value = params.get("count_failed", False) if isinstance(params, Mapping) else False
    if not isinstance(value, bool):
        raise ValueError("count_failed must be true or false")
    return value


_RULE_KEYS = ("type", "tolerance", "rel_tolerance", "element", "fields", "ignore")


def _rule(params: Mapping[str, Any]) -> Rule:
    return rule_from({k: params[k] for k in _RULE_KEYS if k in params})


@kind("must_call")
def _must_call(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    if isinstance(params, Mapping):
        _mapping(params, ("tool",))
    return MustCall(_tool(params))


@kind("must_not_call")
def _must_not_call(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    return MustNotCall(_tool(params), _flag(params))


@kind("call_at_most")
def _call_at_most(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    return CallAtMost(*_count(params))


@kind("call_at_least")
def _call_at_least(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    tool, n, flag = _count(params)
    if flag:
        raise ValueError("count_failed does not apply to call_at_least: a failed call never counts")
    return CallAtLeast(tool, n)


@kind("ordering")
def _ordering(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    flag = False
    if isinstance(params, Mapping):
        flag = _flag(_mapping(params, ("tools",), ("count_failed",)))
        params = params["tools"]
    if not isinstance(params, list) or len(params) < 2 or not all(isinstance(t, str) and t for t in params):
        raise ValueError("expects a list of at least two tool names")
    return Ordering(tuple(params), flag)


@kind("arg_equals")
def _arg_equals(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    p = _mapping(params, ("tool", "arg"), ("value", "from_context", *_RULE_KEYS))
    if ("value" in p) == ("from_context" in p):
        raise ValueError("needs exactly one of value or from_context")
    return ArgEquals(p["tool"], p["arg"], p.get("value"), p.get("from_context"), _rule(p))


@kind("arg_satisfies")
def _arg_satisfies(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    p = _mapping(params, ("tool", "arg", "predicate"))
    name = p["predicate"]
    if name not in predicates:
        known = ", ".join(sorted(predicates)) or "none declared"
        raise ValueError(f"unknown predicate {name!r} (known: {known})")
    return ArgSatisfies(p["tool"], p["arg"], name, predicates[name])


@kind("arg_matches_result")
def _arg_matches_result(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    p = _mapping(params, ("tool", "arg", "result_tool", "field"), _RULE_KEYS)
    return ArgMatchesResult(p["tool"], p["arg"], p["result_tool"], p["field"], _rule(p))


# --------------------------------------------------------------------------------------------
# events the run reported: guardrail results and execution-state changes (`Step.kind == "event"`)


def _as_text(value: Any) -> str:
    """A value as the convention writes provider-native results: canonical strings (`true`, `6`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class EventMatch:
    """Which reported events a spec means: the event's name and the attribute values it must have.

    The convention forbids reading an allow or deny verdict into a guardrail's provider-native result,
    so the spec says which values it means (`gen_ai.guardrail.result.value: GUARDRAIL_INTERVENED`); a
    list is any of its values. Compared as the convention's canonical strings.
    """

    event: str
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def matches(self, step: Step) -> bool:
        if step.kind != "event" or step.name != self.event:
            return False
        attrs = step.args if isinstance(step.args, dict) else {}
        return all(key in attrs and _as_text(attrs[key]) in allowed for key, allowed in self.where)

    def found(self, trajectory: Trajectory) -> list[int]:
        return [i for i, step in enumerate(trajectory.steps) if self.matches(step)]

    def describe(self) -> dict[str, Any]:
        where = {k: list(v) if len(v) > 1 else v[0] for k, v in self.where}
        return {"event": self.event, **({"where": where} if where else {})}

    def label(self) -> str:
        where = ", ".join(f"{k}={'|'.join(v)}" for k, v in self.where)
        return f"{self.event} ({where})" if where else self.event


@dataclass(frozen=True)
class NoEvent:
    """The run reported no event matching `match` (no guardrail intervened, no state changed)."""

    match: EventMatch

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        found = self.match.found(trajectory)
        if not found:
            return Verdict.ok()
        return Verdict.fail(f"{self.match.label()} at step {found[0]}", found[0], trajectory.steps[found[0]].name)

    def describe(self) -> dict[str, Any]:
        return {"no_event": self.match.describe()}


@dataclass(frozen=True)
class EventBefore:
    """Every successful call of `tool` comes after an event matching `match` (a guardrail checked its input)."""

    match: EventMatch
    tool: str

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        later = calls(trajectory, self.tool)
        if not later:
            return Verdict.na(f"{self.tool} never successfully called")
        found = self.match.found(trajectory)
        if found and found[0] < later[0]:
            return Verdict.ok()
        return Verdict.fail(f"{self.tool} at step {later[0]} before any {self.match.label()}", later[0], self.tool)

    def describe(self) -> dict[str, Any]:
        return {"event_before": {**self.match.describe(), "tool": self.tool}}


@dataclass(frozen=True)
class NoCallAfterEvent:
    """After the first event matching `match` (a guardrail's tripwire), no tool (of `tools`, or any) is called.

    Not applicable when no such event was reported: the run says nothing about what follows one.
    """

    match: EventMatch
    tools: tuple[str, ...] = ()
    count_failed: bool = False

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        found = self.match.found(trajectory)
        if not found:
            return Verdict.na(f"no {self.match.label()}")
        for i in range(found[0] + 1, len(trajectory.steps)):
            step = trajectory.steps[i]
            if (step.kind == "tool_call" or is_handoff(step)) and (not self.tools or step.name in self.tools) \
                    and (self.count_failed or step.error is None):
                return Verdict.fail(f"{step.name} called at step {i} after {self.match.label()} at step {found[0]}", i, step.name)
        return Verdict.ok()

    def describe(self) -> dict[str, Any]:
        return {"no_call_after_event": {**self.match.describe(), "tools": list(self.tools), "count_failed": self.count_failed}}


def _event_match(params: Mapping[str, Any]) -> EventMatch:
    event = params["event"]
    if not isinstance(event, str) or not event.strip():
        raise ValueError("event must be a non-empty string (gen_ai.guardrail.result, gen_ai.execution.state.changed)")
    where = params.get("where", {})
    if not isinstance(where, Mapping) or not all(isinstance(k, str) and k for k in where):
        raise ValueError("where must map attribute names to a value or a list of values")
    pairs = []
    for key, value in where.items():
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (Mapping, list)) or v is None for v in values):
            raise ValueError(f"where.{key} must be a value or a list of values")
        pairs.append((key, tuple(_as_text(v) for v in values)))
    return EventMatch(event, tuple(pairs))


@kind("no_event")
def _no_event(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    return NoEvent(_event_match(_mapping(params, ("event",), ("where",))))


@kind("event_before")
def _event_before(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    p = _mapping(params, ("event", "tool"), ("where",))
    return EventBefore(_event_match(p), p["tool"])


@kind("no_call_after_event")
def _no_call_after_event(params: Any, predicates: Mapping[str, Predicate]) -> Invariant:
    p = _mapping(params, ("event",), ("where", "tools", "count_failed"))
    tools = p.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
        raise ValueError("tools must be a list of tool names")
    return NoCallAfterEvent(_event_match(p), tuple(tools), _flag(p))
