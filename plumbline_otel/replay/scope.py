"""The running trial, as seen from inside an adapter: identity, budget, cache and fault.

The driver opens a fresh ``TrialScope`` for every attempt of every trial and makes it current
(a context variable, so each worker thread sees its own). Code that runs inside the trial reads
it: the response cache's transport (``cache.py``) keys and meters model calls with it, and an
in-process agent's tool wrapper calls ``inject_fault(tool)`` so the trial's declared fault fires
there. The injector is built from the immutable ``FaultPlan`` per scope, so every trial sees its
fault (the seed system kept a fail-once flag on the shared variant: one fault per process).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.budget import TrialBudget
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.replay.jsonvalue import JsonObject
from plumbline_otel.runs import FAULT_FIRED


class Cassette(Protocol):
    """What a trial's scope holds of the response cache (`cache.ResponseCache`): its mode, a lookup and a record.
    Named here, so the cache imports the scope and never the other way round."""

    @property
    def mode(self) -> str: ...

    def get(self, key: str) -> JsonObject | None: ...

    def put(self, entry: JsonObject) -> None: ...


class InjectedFault(Exception):
    """A transient tool failure injected by the trial's fault plan (looks like a real one).

    Its text is exactly ``plan.error_message``, the ``plumbline.fault.error`` the trial carries,
    so the store can tell this failure from any other failure of the same tool.
    """

    def __init__(self, plan: FaultPlan) -> None:
        super().__init__(plan.error_message)
        self.kind = plan.kind
        self.tool = plan.tool


@dataclass
class FaultInjector:
    """The mutable state of one trial's fault; built per trial, never shared."""

    plan: FaultPlan
    calls_seen: int = 0
    fired_calls: list[int] = field(default_factory=list)

    def before_call(self, tool: str) -> None:
        if tool != self.plan.tool:
            return
        self.calls_seen += 1
        if self.plan.on_call <= self.calls_seen < self.plan.on_call + self.plan.times:
            self.fired_calls.append(self.calls_seen)
            raise InjectedFault(self.plan)

    @property
    def fired(self) -> bool:
        return bool(self.fired_calls)


@dataclass
class TrialScope:
    """One attempt of one trial."""

    identity: TrialIdentity
    budget: TrialBudget | None = None
    cache: Cassette | None = None
    fault: FaultInjector | None = None
    attempt: int = 1
    abort_reason: str | None = None  # set when the budget or an offline cache stopped a model call
    metadata: JsonObject = field(default_factory=dict)  # the variant's: decoy_tools, temperature, seed, …
    seen: set[str] = field(default_factory=set)  # request perturbations the metered client saw reach the model
    model_calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    _occurrences: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def occurrence(self, content_digest: str) -> int:
        """0 for the first identical request in this attempt, 1 for the next, … (part of the cache key)."""
        with self._lock:
            n = self._occurrences.get(content_digest, 0)
            self._occurrences[content_digest] = n + 1
            return n

    def observe_request(self, body: Mapping[str, object]) -> None:
        """Before a metered model call: note whether the variant's decoys and sampling are in the request
        (an agent that drops them measured nothing about them, and its trial is not scored)."""
        decoys = {str(d.get("name")) for d in _items(self.metadata.get("decoy_tools")) if isinstance(d, dict)}
        offered = {str(t.get("name") or (t.get("function") or {}).get("name")) for t in _items(body.get("tools")) if isinstance(t, dict)}
        if decoys and decoys <= offered:
            self.seen.add("decoy_tools")
        planned = {k: self.metadata[k] for k in ("temperature", "top_p", "seed") if self.metadata.get(k) is not None}
        if planned and all(body.get(k) == v for k, v in planned.items() if k != "seed" or "seed" in body):
            self.seen.add("sampling")

    def charge(self, estimate_usd: float) -> None:
        """Before a paid call: make room for ``estimate_usd`` in the cap or raise BudgetExceeded."""
        if self.budget is not None:
            try:
                self.budget.ensure(estimate_usd)
            except ReplayError as exc:
                self.abort_reason = f"budget: {exc}"
                raise

    def spent(self, usd: float) -> None:
        """After a paid call: record what it cost."""
        if self.budget is not None:
            self.budget.add(usd)

    def unseen(self, estimate_usd: float | None) -> None:
        """After a call whose usage never came: its estimate, or (None) no less than the reservation (`TrialBudget.add_estimate`)."""
        if self.budget is not None:
            self.budget.add_estimate(estimate_usd)


def _items(value: object) -> list[object] | tuple[object, ...]:
    """A JSON list's items; nothing for anything else (no object is found in it either)."""
    return value if isinstance(value, list | tuple) else []


_CURRENT: contextvars.ContextVar[TrialScope | None] = contextvars.ContextVar("plumbline_replay_trial", default=None)


def current_scope() -> TrialScope | None:
    """The trial this code runs in, or None outside a replay."""
    return _CURRENT.get()


@contextmanager
def activate(scope: TrialScope) -> Iterator[TrialScope]:
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)


def inject_fault(tool: str) -> None:
    """Call before running ``tool`` in an in-process agent: raises the trial's fault when due."""
    scope = _CURRENT.get()
    if scope is not None and scope.fault is not None:
        scope.fault.before_call(tool)


def current_trial_attributes() -> dict[str, str | int | bool]:
    """The current attempt's ``plumbline.*`` attributes for an in-process agent's root span (empty
    outside a replay). Read it when the root span ends: on a faulted trial it then includes
    ``plumbline.fault.fired``, true exactly when this attempt's injector raised."""
    scope = _CURRENT.get()
    if scope is None:
        return {}
    attrs = scope.identity.attributes()
    if scope.fault is not None:
        attrs[FAULT_FIRED] = scope.fault.fired
    return attrs
