"""What the proxy witnessed in one attempt of one trial, kept per route and frozen at close.

``TrialState`` is the mutable account the request handlers update (under its lock, since an
agent may make concurrent calls); ``ProxyEvidence`` is its frozen summary, which the driver
writes into the trial's record so exposure and cost never depend on the agent's own report.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from plumbline_otel.replay.jsonvalue import JsonObject, to_int
from plumbline_otel.replay.perturb import ModelFaultPlan, ToolResultFaultPlan
from plumbline_otel.replay.pricing import Usage

if TYPE_CHECKING:
    from plumbline_otel.replay.adapters import Trial
    from plumbline_otel.replay.budget import TrialBudget
    from plumbline_otel.replay.tape import Branch


@dataclass(frozen=True)
class ProxyEvidence:
    """One attempt as the model-API proxy saw it.

    ``cost_usd`` is exact (each call priced from its full usage) or None when a model answered
    that has no price (``unpriced_models`` names them); ``cost_exact`` is False when a call's
    usage was missing and its conservative estimate was charged instead.

    Whose fault a failure was, so the driver never blames the agent for it:
    ``provider_failures`` lists each call on which the provider failed by itself (never one the
    proxy injected: those are in ``faults``), ``{call, status, detail, kind, recovered}``: ``status``
    what the agent was answered (the provider's 5xx or 429, the proxy's 502 or 504, or 200 for a
    stream cut after its head), ``kind`` one of ``unreachable``, ``timeout``, ``transport``,
    ``status``, ``rate_limited``, ``garbage``, ``stream_cut``, ``too_large``, and ``recovered``
    whether a later call of the attempt got a whole answer (the agent's retry went through).
    ``proxy_errors`` lists the proxy's own failures and limit refusals, ``{call, status, detail,
    kind}`` (``internal``: an exception inside the proxy, answered 500 or a dropped connection;
    ``request_too_large``, ``bad_request_framing``, ``memory``: the proxy's limits). Refusals for
    the spend cap and the offline cassette stay in ``refused_budget`` / ``refused_offline``.
    """

    witness: ClassVar[str] = "model_proxy"  # who saw it, in the driver's record and the certificate's evidence_from

    trial_id: str
    attempt: int
    calls: int  # model-API calls the agent made through this route, faulted and refused ones included
    upstream_calls: int  # of those, how many reached the provider
    cache_hits: int
    refused_budget: int
    refused_offline: int  # replay mode, no recorded answer
    budget_stop: str | None
    usage: Usage
    cost_usd: float | None
    cost_exact: bool
    unpriced_models: tuple[str, ...]
    faults: tuple[JsonObject, ...]  # {kind, call, detail}
    decoys_offered: tuple[str, ...]
    decoys_proposed: tuple[str, ...]
    sampling_changes: tuple[JsonObject, ...]  # {call, param, before, after}: the provider got a different value
    exchanges: tuple[JsonObject, ...]  # {call, api, model, status, source, key, request_sha256}
    passthrough: int  # other endpoints forwarded unmetered (model lists, token counts)
    provider_failures: tuple[JsonObject, ...] = ()  # {call, status, detail, kind, recovered}
    proxy_errors: tuple[JsonObject, ...] = ()  # {call, status, detail, kind}
    # Planned sampling that changed nothing the provider honours: skipped (the API or model takes no such parameter)
    # or equal to what the request already meant (its own value, or the API's default); never evidence of reach.
    sampling_unchanged: tuple[JsonObject, ...] = ()
    # Branch-point replay (issue 44): calls answered from the run's tape (no provider call), and where the agent's
    # request in the prefix differed from the recorded one ({step, call, detail}; the driver makes the trial missing).
    tape_served: int = 0
    diverged: tuple[JsonObject, ...] = ()
    # A paraphrased user turn at a branch point: how many requests carried it to the model (None: no such trial).
    # A trial whose agent stopped before that turn never met its perturbation: the driver does not score it.
    turn_rewrites: int | None = None

    def as_dict(self) -> JsonObject:
        return {
            "trial_id": self.trial_id, "attempt": self.attempt, "calls": self.calls, "upstream_calls": self.upstream_calls,
            "cache_hits": self.cache_hits, "refused_budget": self.refused_budget, "refused_offline": self.refused_offline,
            "budget_stop": self.budget_stop, "usage": self.usage.as_dict(), "cost_usd": self.cost_usd,
            "cost_exact": self.cost_exact, "unpriced_models": list(self.unpriced_models), "faults": list(self.faults),
            "decoys_offered": list(self.decoys_offered), "decoys_proposed": list(self.decoys_proposed),
            "sampling_changes": list(self.sampling_changes), "exchanges": list(self.exchanges),
            "passthrough": self.passthrough, "provider_failures": [dict(f) for f in self.provider_failures],
            "proxy_errors": [dict(e) for e in self.proxy_errors],
            "sampling_unchanged": [dict(c) for c in self.sampling_unchanged],
            **({"tape_served": self.tape_served, "diverged": [dict(d) for d in self.diverged]}
               if self.tape_served or self.diverged else {}),
            **({"turn_rewrites": self.turn_rewrites} if self.turn_rewrites is not None else {}),
        }


@dataclass
class TrialState:
    """The live account of one route (one attempt of one trial)."""

    trial: Trial
    budget: TrialBudget | None
    token: str
    model_fault: ModelFaultPlan | None = None
    tool_result_fault: ToolResultFaultPlan | None = None
    decoys: list[JsonObject] = field(default_factory=list)
    sampling: JsonObject = field(default_factory=dict)
    calls: int = 0
    upstream_calls: int = 0
    cache_hits: int = 0
    refused_budget: int = 0
    refused_offline: int = 0
    passthrough: int = 0
    budget_stop: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    cost_exact: bool = True
    unpriced: set[str] = field(default_factory=set)
    faults: list[JsonObject] = field(default_factory=list)
    decoys_offered: list[str] = field(default_factory=list)
    decoys_proposed: list[str] = field(default_factory=list)
    sampling_changes: list[JsonObject] = field(default_factory=list)
    sampling_unchanged: list[JsonObject] = field(default_factory=list)
    exchanges: list[JsonObject] = field(default_factory=list)
    provider_failures: list[JsonObject] = field(default_factory=list)
    proxy_errors: list[JsonObject] = field(default_factory=list)
    tool_ids: dict[str, list[str]] = field(default_factory=dict)  # tool name -> its call ids, first seen first
    fault_target: str | None = None  # the call id whose result tool_result_fault replaces
    branch: Branch | None = None  # a branch-point replay: the prefix is served from its tape (issue 44)
    tape_served: int = 0
    turn_rewrites: int = 0
    closed: bool = False
    inflight: int = 0  # calls being served; close waits for them, so their cost is in the evidence
    _occurrences: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _idle: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def enter(self) -> None:
        with self._idle:
            self.inflight += 1

    def leave(self) -> None:
        with self._idle:
            self.inflight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is being served (the agent has its answer before the proxy has accounted it)."""
        with self._idle:
            return self._idle.wait_for(lambda: self.inflight == 0, timeout)

    def next_call(self) -> int:
        with self.lock:
            self.calls += 1
            return self.calls

    def occurrence(self, digest: str) -> int:
        """0 for the first identical request of this attempt, 1 for the next (part of the cache key)."""
        with self.lock:
            n = self._occurrences.get(digest, 0)
            self._occurrences[digest] = n + 1
            return n

    def learn_tool_calls(self, calls: list[tuple[str, str]]) -> None:
        """Note (id, name) tool calls in the order the conversation shows them."""
        with self.lock:
            for call_id, name in calls:
                ids = self.tool_ids.setdefault(name, [])
                if call_id not in ids:
                    ids.append(call_id)

    def fault_call_id(self) -> str | None:
        """The id of the planned tool call whose result is to be replaced, once it is known."""
        plan = self.tool_result_fault
        if plan is None:
            return None
        with self.lock:
            ids = self.tool_ids.get(plan.tool, [])
            if self.fault_target is None and len(ids) >= plan.on_call:
                self.fault_target = ids[plan.on_call - 1]
            return self.fault_target

    def add_fault(self, kind: str, call: int, detail: str) -> None:
        with self.lock:
            self.faults.append({"kind": kind, "call": call, "detail": detail})

    def provider_failed(self, call: int, status: int, kind: str, detail: str) -> None:
        """Note a call on which the provider failed by itself (not a fault this proxy injected)."""
        with self.lock:
            self.provider_failures.append({"call": call, "status": status, "detail": detail, "kind": kind})

    def proxy_failed(self, call: int | None, status: int, kind: str, detail: str) -> None:
        """Note the proxy's own failure or limit refusal on a call of this attempt."""
        with self.lock:
            self.proxy_errors.append({"call": call, "status": status, "detail": detail, "kind": kind})

    def _recovered(self, call: int) -> bool:
        """Whether a later call of this attempt got a whole 2xx answer (caller holds the lock)."""
        return any(to_int(e["call"]) > call and 200 <= to_int(e["status"]) < 300 and not e.get("incomplete") and e["source"] in ("live", "cache")
                   for e in self.exchanges)

    def charge(self, model: str | None, usage: Usage | None, cost: float | None, estimate: float | None) -> None:
        """Account a finished upstream call: its usage and exact cost (the estimate when usage was missing)."""
        with self.lock:
            if usage is not None:
                self.usage = self.usage + usage
            if usage is None:
                self.cost_exact = False
                self.cost_usd += estimate or 0.0
            elif cost is None:
                self.unpriced.add(str(model or usage.model))
            else:
                self.cost_usd += cost

    def evidence(self) -> ProxyEvidence:
        with self.lock:
            identity = self.trial.identity
            return ProxyEvidence(
                trial_id=identity.trial_id, attempt=identity.attempt, calls=self.calls, upstream_calls=self.upstream_calls,
                cache_hits=self.cache_hits, refused_budget=self.refused_budget, refused_offline=self.refused_offline,
                budget_stop=self.budget_stop, usage=self.usage,
                cost_usd=None if self.unpriced else round(self.cost_usd, 10), cost_exact=self.cost_exact,
                unpriced_models=tuple(sorted(self.unpriced)), faults=tuple(self.faults),
                decoys_offered=tuple(self.decoys_offered), decoys_proposed=tuple(self.decoys_proposed),
                sampling_changes=tuple(self.sampling_changes), exchanges=tuple(self.exchanges), passthrough=self.passthrough,
                provider_failures=tuple({**f, "recovered": self._recovered(to_int(f["call"]))} for f in self.provider_failures),
                proxy_errors=tuple(dict(e) for e in self.proxy_errors), sampling_unchanged=tuple(self.sampling_unchanged),
                tape_served=self.tape_served, diverged=tuple(dict(d) for d in self.branch.diverged) if self.branch else (),
                turn_rewrites=self.turn_rewrites if isinstance(self.trial.metadata.get("turn_paraphrase"), Mapping) else None)
