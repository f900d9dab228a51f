"""Perturbations: small registered functions that turn a task into variants.

Each perturbation returns candidate ``(text, metadata)`` pairs for a task; ``build_variants``
gives every candidate a stable id (index plus a digest of its text and metadata, so a changed
input never reuses an old trial id), puts every text-changing candidate through the
semantic-equivalence guard, and keeps rejected candidates with their reason instead of running
them. Randomness comes from one RNG per (seed, task, perturbation), derived with SHA-256, so
variants are the same in every process and adding a perturbation does not shift the others.

Registered:
    baseline      the request as recorded (one variant; repeats give its self-consistency)
    paraphrase    template rewording (clause order, a synonym table, a polite prefix or suffix),
                  or a pluggable paraphraser (``PerturbOptions.paraphraser``, e.g. a model)
    distractor    unrelated office chatter before or after the request (guarded too)
    decoy_tools   metadata ``decoy_tools``: plausible extra tool specs the adapter should offer
    sampling      metadata ``temperature`` (0.7, 0.3) or ``top_p`` (0.5), never an API's default, and a
                  ``seed`` (sent only to Chat Completions); the text is unchanged
    tool_fault    metadata ``fault``: a declarative transient fault (tool, kind, which call),
                  turned into a fresh injector for every trial
    model_fault   metadata ``model_fault``: the model API fails one call (rate limit, overloaded,
                  timeout, a stream cut short); applied by the model-API proxy
    tool_result_fault
                  metadata ``tool_result_fault``: the planned tool ran (its side effect happened)
                  but the model is shown an error as its result; applied by the model-API proxy

``tool_fault`` and ``tool_result_fault`` differ in what happened in the world: under
``tool_fault`` the tool fails *before it acts* (nothing was refunded, nothing was sent), so a
retry is the right move; under ``tool_result_fault`` the tool *acted* and only its answer was
lost on the way back to the model, so a blind retry repeats the side effect (pays twice). The
second is what a timeout after a committed write looks like, and what invariants such as "never
pay twice" are there to catch.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from plumbline_otel.plugins import DomainLexicon
from plumbline_otel.replay.guard import EquivalenceModel, GuardVerdict, MessagesClient, check_equivalent
from plumbline_otel.replay.identity import TRANSIENT_FAULT_KINDS, FaultPlan
from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue
from plumbline_otel.replay.tasks import ReplayTask

Candidate = tuple[str, JsonObject]

MODEL_FAULT_KINDS = ("rate_limit", "overloaded", "timeout", "stream_cut")


@dataclass(frozen=True)
class ModelFaultPlan:
    """Fail model call number ``on_call`` of an attempt (and ``times - 1`` more) at the model-API proxy.

    ``rate_limit`` answers 429, ``overloaded`` 529 (Anthropic) or 503 (OpenAI), ``timeout`` holds the
    call ``hold_s`` seconds and then answers 504, and ``stream_cut`` passes ``after_events`` SSE
    events of the real answer (or half of a whole body) and then drops the connection. The first
    three never reach the provider and cost nothing; a cut stream was generated and is paid for.
    """

    kind: str = "rate_limit"
    on_call: int = 1
    times: int = 1
    hold_s: float = 2.0
    after_events: int = 2

    def __post_init__(self) -> None:
        if self.kind not in MODEL_FAULT_KINDS:
            raise ValueError(f"model fault kind {self.kind!r} is not one of {', '.join(MODEL_FAULT_KINDS)}")
        if self.on_call < 1 or self.times < 1:
            raise ValueError("model fault on_call and times must be at least 1")
        if self.hold_s < 0 or self.after_events < 0:
            raise ValueError("model fault hold_s and after_events cannot be negative")

    def due(self, call: int) -> bool:
        """Whether model call number ``call`` (1-based) of the attempt is faulted."""
        return self.on_call <= call < self.on_call + self.times

    def as_dict(self) -> JsonObject:
        return {"kind": self.kind, "on_call": self.on_call, "times": self.times, "hold_s": self.hold_s,
                "after_events": self.after_events}

    @classmethod
    def from_dict(cls, data: JsonValue | Mapping[str, object]) -> ModelFaultPlan | None:
        """A plan from its JSON (``as_dict``), or None for none; TypeError for JSON that is not an object, ValueError
        for a field the plan has not or of the wrong type."""
        if not data:
            return None
        data = _plan_object(cls, data)
        _only_fields(cls, data)
        return cls(_field(data, "kind", str, "rate_limit"), _field(data, "on_call", int, 1), _field(data, "times", int, 1),
                   _field(data, "hold_s", float, 2.0), _field(data, "after_events", int, 2))


@dataclass(frozen=True)
class ToolResultFaultPlan:
    """Replace the result of call number ``on_call`` of ``tool`` with an error, on its way to the model.

    The tool ran; only the model's view of its result is a failure (see the module docstring for
    how this differs from ``tool_fault``). The error text is ``tool_fault``'s for the same kind,
    so the store matches the failure the same way.
    """

    tool: str
    kind: str = "503"
    on_call: int = 1

    def __post_init__(self) -> None:
        FaultPlan(self.tool, self.kind, self.on_call)  # the same validation as a tool fault

    @property
    def error_message(self) -> str:
        return FaultPlan(self.tool, self.kind).error_message

    def as_dict(self) -> JsonObject:
        return {"tool": self.tool, "kind": self.kind, "on_call": self.on_call}

    @classmethod
    def from_dict(cls, data: JsonValue | Mapping[str, object]) -> ToolResultFaultPlan | None:
        """A plan from its JSON (``as_dict``), or None for none; errors as ``ModelFaultPlan.from_dict``."""
        if not data:
            return None
        data = _plan_object(cls, data)
        _only_fields(cls, data)
        if "tool" not in data:
            raise ValueError(f"tool result fault plan {dict(data)!r}: no tool")
        return cls(_field(data, "tool", str, ""), _field(data, "kind", str, "503"), _field(data, "on_call", int, 1))


def _plan_object(plan: type[ModelFaultPlan] | type[ToolResultFaultPlan], data: JsonValue | Mapping[str, object]) -> Mapping[str, object]:
    """A plan's JSON as the object it must be (``cls(**data)`` once gave a TypeError for anything else too)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{plan.__name__}: its JSON is not an object: {data!r}")
    return data


def _only_fields(plan: type[ModelFaultPlan] | type[ToolResultFaultPlan], data: Mapping[str, object]) -> None:
    """A plan's JSON names only the plan's fields (what ``cls(**data)`` once checked)."""
    unknown = sorted(set(data) - set(plan.__dataclass_fields__))
    if unknown:
        raise ValueError(f"{plan.__name__} {dict(data)!r}: unknown field(s) {', '.join(unknown)}")


_T = TypeVar("_T", str, int, float)


def _field(data: Mapping[str, object], key: str, kind: type[_T], default: _T) -> _T:
    """``data[key]`` as a plan's field of type ``kind`` (an int is a float too; a bool is neither), else ValueError."""
    value = data.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"plan {dict(data)!r}: {key} is not a {kind.__name__}")
    return value


class Paraphraser(Protocol):
    """Rewords ``text`` into up to ``n`` candidates (the guard then filters them)."""

    def __call__(self, text: str, n: int, rng: random.Random) -> list[str]: ...


DISTRACTORS = (
    "By the way, the coffee machine on the third floor is working again.",
    "Unrelated, but the team lunch has moved to the usual place down the road.",
    "FYI, the printer near reception is out of toner again.",
    "Also, the parking garage will be repainted at some point next week.",
    "Reminder: there is a fire drill sometime this week.",
    "Someone left a blue umbrella in the big meeting room.",
)

DECOY_TOOLS: tuple[JsonObject, ...] = (
    {"name": "search_knowledge_base", "description": "Search the internal knowledge base for help articles.",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "lookup_employee", "description": "Look up an employee's department and manager by name.",
     "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    {"name": "create_calendar_event", "description": "Create a calendar event for the current user.",
     "input_schema": {"type": "object", "properties": {"title": {"type": "string"}, "when": {"type": "string"}},
                      "required": ["title", "when"]}},
)

SYNONYMS = {
    "process": "handle", "handle": "process", "check": "verify", "verify": "check", "review": "look over",
    "confirm": "double-check", "quickly": "promptly", "help": "assist", "need": "require", "ensure": "make sure",
}
PREFIXES = ("Hi,", "Hello there.", "When you have a moment:", "Quick one:")
SUFFIXES = ("Thanks!", "Thank you.", "Much appreciated.")
_SEQUENCE_WORDS = re.compile(r"\b(then|after|afterwards|before|first|next|finally|once|until)\b", re.I)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


class _NoCandidates(Exception):
    """A perturbation could not produce candidates for a task (the reason is recorded)."""


@dataclass(frozen=True)
class PerturbOptions:
    """How many variants per perturbation and what the perturbations draw from."""

    variants: int = 1  # per perturbation (baseline always has one)
    seed: int = 7
    paraphraser: Paraphraser | None = None  # None: the templates
    # A model's reading beside the guard's rules (guard.ModelEquivalenceCheck), which can only reject more.
    equivalence: Callable[[str, str], object] | None = None  # gives a guard.GuardVerdict
    # The domain's words for the guard (its plug-in's DomainLexicon); None: every installed domain's.
    lexicon: DomainLexicon | None = None
    distractors: tuple[str, ...] = DISTRACTORS
    decoy_tools: tuple[Mapping[str, object], ...] = DECOY_TOOLS
    fault_tools: tuple[str, ...] = ()  # fault these tools; empty: the preferred ones the source run called, else all it called
    preferred_fault_tools: tuple[str, ...] = ()  # a domain's choice of targets (checks rather than effects)
    fault_kinds: tuple[str, ...] = TRANSIENT_FAULT_KINDS
    model_fault_kinds: tuple[str, ...] = MODEL_FAULT_KINDS
    # Every sampling variant moves one parameter away from what all three APIs default to (temperature 1.0,
    # top_p 1.0): temperatures first, then top_p values, with a seed the proxy sends only where it is accepted.
    # One parameter per variant: Anthropic's newer models refuse temperature and top_p together.
    temperatures: tuple[float, ...] = (0.7, 0.3)
    top_ps: tuple[float, ...] = (0.5,)


@dataclass(frozen=True)
class Variant:
    """One variant of one task under one perturbation; ``rejected`` says why it is not run."""

    task_key: str
    perturbation: str
    variant_id: str
    text: str
    metadata: JsonObject = field(default_factory=dict)
    rejected: str | None = None

    @property
    def fault(self) -> FaultPlan | None:
        fault = self.metadata.get("fault")
        if fault is not None and not isinstance(fault, dict):
            raise ValueError(f"variant {self.variant_id}: its fault plan is not a JSON object: {fault!r}")
        return FaultPlan.from_dict(fault)

    def as_dict(self) -> dict[str, object]:
        return {"task_key": self.task_key, "perturbation": self.perturbation, "variant_id": self.variant_id,
                "text": self.text, "metadata": self.metadata, "rejected": self.rejected}


@dataclass(frozen=True)
class Perturbation:
    name: str
    build: Callable[[ReplayTask, PerturbOptions, random.Random], list[Candidate]]
    changes_text: bool
    preserves: str


PERTURBATIONS: dict[str, Perturbation] = {}


# Perturbations only the model-API proxy can apply (they live on the wire between agent and provider).
PROXY_PERTURBATIONS = frozenset({"model_fault", "tool_result_fault"})


def register(name: str, *, changes_text: bool, preserves: str) -> Callable[[Callable[..., list[Candidate]]], Callable[..., list[Candidate]]]:
    """Register ``fn(task, options, rng) -> [(text, metadata), …]`` as perturbation ``name``."""
    def wrap(fn: Callable[..., list[Candidate]]) -> Callable[..., list[Candidate]]:
        PERTURBATIONS[name] = Perturbation(name, fn, changes_text, preserves)
        return fn
    return wrap


def _rng(seed: int, task_key: str, perturbation: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{task_key}:{perturbation}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def _variant_id(index: int, perturbation: str, text: str, metadata: Mapping[str, object]) -> str:
    blob = json.dumps([perturbation, text, metadata], sort_keys=True, separators=(",", ":"), default=str)
    return f"{index}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


# --- the perturbations -------------------------------------------------------------------------


@register("baseline", changes_text=False, preserves="everything: the request as recorded")
def _baseline(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    return [(task.input, {})]


def _lower_first(text: str) -> str:
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        return text[0].lower() + text[1:]
    return text


def _synonyms(text: str, rng: random.Random) -> str:
    words = [w for w in SYNONYMS if re.search(rf"\b{re.escape(w)}\b", text, re.I)]
    if not words:
        return text
    chosen = set(rng.sample(words, k=max(1, len(words) // 2 + (len(words) % 2))))

    def swap(m: re.Match[str]) -> str:
        word = m.group(0)
        if word.lower() not in chosen:
            return word
        new = SYNONYMS[word.lower()]
        return new[0].upper() + new[1:] if word[0].isupper() else new

    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in SYNONYMS) + r")\b", re.I)
    return pattern.sub(swap, text)


def reorder_clauses(text: str) -> str:
    """Move a closing ``from X`` to the front, or swap two sentences with no sequence words."""
    stripped = text.strip()
    sentences = _SENTENCE.split(stripped)
    if len(sentences) == 1:
        m = re.match(r"^(?P<head>.+?)\s+from\s+(?P<src>[^.,;:!?]+?)(?P<end>[.!?]?)$", stripped)
        if m:
            return f"From {m.group('src')}: {_lower_first(m.group('head'))}{m.group('end')}"
        return text
    if len(sentences) == 2 and not _SEQUENCE_WORDS.search(stripped):
        return f"{sentences[1]} {sentences[0]}"
    return text


def template_paraphrases(text: str, n: int, rng: random.Random) -> list[str]:
    """Up to ``n`` distinct template rewordings of ``text`` (none equal to it)."""
    out: list[str] = []
    for _ in range(n * 4):
        if len(out) >= n:
            break
        candidate = text.strip()
        reordered = False
        if rng.random() < 0.5:
            candidate = reorder_clauses(candidate)
            reordered = candidate != text.strip()
        if rng.random() < 0.7:
            candidate = _synonyms(candidate, rng)
        polite = rng.random()
        if (polite < 0.45 and not reordered) or candidate == text.strip():
            candidate = f"{rng.choice(PREFIXES)} {_lower_first(candidate)}"
        elif polite < 0.8:
            candidate = f"{candidate} {rng.choice(SUFFIXES)}"
        if candidate != text.strip() and candidate not in out:
            out.append(candidate)
    return out


@register("paraphrase", changes_text=True, preserves="the task's ids, amounts, dates and currencies (guarded)")
def _paraphrase(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    if options.paraphraser is not None:
        source = getattr(options.paraphraser, "name", type(options.paraphraser).__name__)
        try:
            texts = options.paraphraser(task.input, options.variants, rng)
        except Exception as exc:  # a failed paraphraser rejects the variants; the study goes on
            raise _NoCandidates(f"paraphraser {source} failed: {type(exc).__name__}: {exc}") from exc
    else:
        texts = template_paraphrases(task.input, options.variants, rng)
        source = "templates"
    return [(t, {"paraphraser": source}) for t in texts]


@register("distractor", changes_text=True, preserves="the request; unrelated chatter is added (guarded)")
def _distractor(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    out: list[Candidate] = []
    pool = list(options.distractors)
    for i in range(options.variants):
        for _ in range(20):  # distinct chatter per variant while the pool allows it
            chatter = " ".join(rng.sample(pool, k=min(len(pool), 1 + i % 2)))
            text = f"{task.input.rstrip()}\n\n{chatter}" if i % 2 == 0 else f"{chatter}\n\n{task.input.lstrip()}"
            if all(text != t for t, _ in out):
                break
        out.append((text, {"placement": "after" if i % 2 == 0 else "before"}))
    return out


@register("decoy_tools", changes_text=False, preserves="the request; extra irrelevant tools are offered")
def _decoy_tools(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    decoys = list(options.decoy_tools)
    if not decoys:
        return []
    out: list[Candidate] = []
    for i in range(options.variants):
        chosen = sorted(rng.sample(decoys, k=1 + i % len(decoys)), key=lambda d: str(d["name"]))  # canonical order
        out.append((task.input, {"decoy_tools": [_json(d) for d in chosen]}))
    return out


@register("sampling", changes_text=False, preserves="the request; only sampling parameters change")
def _sampling(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    settings = [("temperature", t) for t in options.temperatures if t != 1.0] + [("top_p", p) for p in options.top_ps if p != 1.0]
    if not settings:  # the APIs' own defaults: a variant that changes nothing the provider does
        raise _NoCandidates("sampling: every temperature and top_p given is the APIs' default (1.0), which changes nothing")
    return [(task.input, {settings[i % len(settings)][0]: settings[i % len(settings)][1], "seed": rng.randrange(2**31)})
            for i in range(options.variants)]


@register("tool_fault", changes_text=False, preserves="the request; one tool call fails transiently")
def _tool_fault(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    preferred = [t for t in options.preferred_fault_tools if t in task.tools]
    targets = list(options.fault_tools or preferred or task.tools)
    if not targets:
        return []
    kinds = list(options.fault_kinds) or ["503"]
    return [(task.input, {"fault": {**FaultPlan(targets[i % len(targets)], kinds[i % len(kinds)]).as_dict()}})
            for i in range(options.variants)]


@register("model_fault", changes_text=False, preserves="the request; one model API call fails (rate limit, overload, timeout, cut stream)")
def _model_fault(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    kinds = list(options.model_fault_kinds) or list(MODEL_FAULT_KINDS)
    return [(task.input, {"model_fault": ModelFaultPlan(kinds[i % len(kinds)]).as_dict()}) for i in range(options.variants)]


@register("tool_result_fault", changes_text=False, preserves="the request; one tool acts but the model is told it failed")
def _tool_result_fault(task: ReplayTask, options: PerturbOptions, rng: random.Random) -> list[Candidate]:
    preferred = [t for t in options.preferred_fault_tools if t in task.tools]
    targets = list(options.fault_tools or preferred or task.tools)
    if not targets:
        return []
    kinds = list(options.fault_kinds) or ["503"]
    return [(task.input, {"tool_result_fault": ToolResultFaultPlan(targets[i % len(targets)], kinds[i % len(kinds)]).as_dict()})
            for i in range(options.variants)]


def _json(value: object) -> JsonValue:
    """``value`` (a decoy tool's spec) as JSON; TypeError for what JSON cannot hold (the proxy sends it as JSON)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    raise TypeError(f"not JSON: {value!r} ({type(value).__name__})")


def _verdicts(check: Callable[[str, str], object] | None) -> EquivalenceModel | None:
    """``options.equivalence`` as the guard calls it; a check that answers other than a GuardVerdict is a TypeError."""
    if check is None:
        return None

    def model(original: str, variant: str) -> GuardVerdict:
        verdict = check(original, variant)
        if not isinstance(verdict, GuardVerdict):
            raise TypeError(f"the equivalence check gave {type(verdict).__name__}, not a GuardVerdict")
        return verdict
    return model


# --- building ----------------------------------------------------------------------------------


def build_variants(task: ReplayTask, perturbations: Sequence[str], options: PerturbOptions = PerturbOptions()) -> list[Variant]:
    """Every variant of ``task`` under each perturbation, guarded; rejected ones are kept, marked."""
    out: list[Variant] = []
    for name in perturbations:
        if name not in PERTURBATIONS:
            raise ValueError(f"unknown perturbation {name!r}; known: {', '.join(PERTURBATIONS)}")
        spec = PERTURBATIONS[name]
        try:
            candidates = spec.build(task, options, _rng(options.seed, task.task_key, name))
        except _NoCandidates as exc:
            out.append(Variant(task.task_key, name, "none", task.input, {}, rejected=str(exc)))
            continue
        if not candidates:
            out.append(Variant(task.task_key, name, "none", task.input, {},
                               rejected=f"{name}: nothing to vary for this task"
                               + (" (its source run called no tool; set fault tools)" if name in ("tool_fault", "tool_result_fault") else "")))
            continue
        seen: set[str] = set()
        for index, (text, metadata) in enumerate(candidates):
            blob = json.dumps([text, metadata], sort_keys=True, default=str)
            if blob in seen:  # an exact repeat of an earlier candidate is not a new variant
                continue
            seen.add(blob)
            rejected = None
            if spec.changes_text or text != task.input:
                verdict = check_equivalent(task.input, text, model=_verdicts(options.equivalence), lexicon=options.lexicon)
                rejected = verdict.reason
            out.append(Variant(task.task_key, name, _variant_id(index, name, text, metadata), text, metadata, rejected))
    return out


class AnthropicParaphraser:
    """A model-based paraphraser through the ``anthropic`` client (the guard still checks each one)."""

    name = "anthropic"
    SYSTEM = ("Rewrite the user's request in different words, keeping its meaning exactly: the same "
              "documents, ids, amounts, dates and actions; add no instructions and remove nothing. "
              "Vary the register (terse, chatty, formal, hurried). Answer with only a JSON array of strings.")

    def __init__(self, client: MessagesClient, model: str, max_tokens: int = 1024) -> None:
        self.client, self.model, self.max_tokens = client, model, max_tokens

    def __call__(self, text: str, n: int, rng: random.Random) -> list[str]:
        response = self.client.messages.create(
            model=self.model, max_tokens=self.max_tokens, system=self.SYSTEM,
            messages=[{"role": "user", "content": f"Give {n} rewordings of:\n\n{text}"}])
        raw = "".join(getattr(b, "text", "") for b in response.content).strip()
        raw = re.sub(r"^```(?:json)?|```$", "", raw).strip()
        if not raw.startswith("["):
            start, end = raw.find("["), raw.rfind("]")
            raw = raw[start:end + 1] if 0 <= start < end else "[]"
        try:
            items = json.loads(raw)
        except ValueError:
            return []
        return [s for s in items if isinstance(s, str) and s.strip()][:n]
