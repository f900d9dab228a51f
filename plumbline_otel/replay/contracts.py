"""The replay wing's contracts, written once: a trial, what an adapter reports, and every member the driver may read of
an adapter and of a proxy.

    Trial          one attempt to make: identity, variant text, metadata, fault, sink, proxy routes
    TrialOutcome   what an adapter reports about an attempt that ran (claims, kept beside the driver's record)
    Adapter        how the driver reaches the agent: ``run`` and eight optional members, each with a default
    AdapterBase    those defaults, for an adapter class to inherit
    DeclaredAdapter  another object with ``run`` as an ``Adapter`` (the one place optional members are looked up;
                   ``adapters.adapter_of`` picks it)
    DomainTools    what planning reads of an adapter (its decoys and preferred fault targets)
    TrialProxy     a witness in the agent's path (the model-API proxy, the MCP proxy): open and close an attempt's route;
                   ``BranchingProxy`` one that also serves a branch-point replay's prefix from its tape
    TrialRoute     one attempt's way into a proxy; ``Evidence`` what the proxy saw in it

Who reads what: the driver (`replay.plan`, `replay.engine`, `replay.study`) reads ``run``, ``service``, ``service_version``,
``decoy_tools``, ``fault_tools``, ``cancel`` and ``grace_s``; the command (`cli.replay`) reads ``describe`` and
``close`` as well. Nothing else of an adapter is read. Whatever an adapter reports is the agent's claim: it never
decides a trial's status or exposure (`plumbline_otel.trials`).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from plumbline_otel.errors import ConfigError, ReplayError
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.replay.jsonvalue import JsonObject as JsonObject  # a value as JSON carries it: metadata, evidence, reports
from plumbline_otel.replay.jsonvalue import JsonValue as JsonValue
from plumbline_otel.runs import FAULT

if TYPE_CHECKING:
    from plumbline_otel.replay.budget import TrialBudget
    from plumbline_otel.replay.export import SpanSink
    from plumbline_otel.replay.tape import Tape
    from plumbline_otel.replay.tasks import ReplayTask



class AdapterError(ReplayError):
    """The agent could not be run for this trial (not retried)."""


class TransientAdapterError(AdapterError):
    """A failure worth retrying (the agent did not run); ``retry_after`` seconds if the peer said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AttemptInterrupted(ReplayError):
    """The runner was stopped (SIGTERM, Ctrl-C) while this attempt ran, and stopped the agent: never the agent's result."""


@dataclass(frozen=True)
class Trial:
    """One run to make: who (identity), what (text, metadata, fault), where spans go (sink)."""

    identity: TrialIdentity
    task: ReplayTask
    text: str
    metadata: JsonObject = field(default_factory=dict, hash=False)
    fault: FaultPlan | None = None
    sink: SpanSink | None = field(default=None, hash=False, compare=False)
    routes: dict[str, str] = field(default_factory=dict, hash=False, compare=False)  # the attempt's proxy URLs, as env variables

    @property
    def trial_id(self) -> str:
        return self.identity.trial_id

    @property
    def trace_id(self) -> str:
        return self.identity.trace_id

    @property
    def branch_at(self) -> int | None:
        """The step a branch-point replay runs live from (metadata ``branch_at``; issue 44), or None."""
        value = self.metadata.get("branch_at")
        return int(value) if value and isinstance(value, (int, float, str)) else None

    def plan(self, key: str) -> JsonObject | None:
        """A proxy's plan in the metadata (``model_fault``, ``tool_result_fault``), when the variant has one."""
        value = self.metadata.get(key)
        return value if isinstance(value, dict) else None

    def decoy_specs(self) -> list[JsonObject]:
        """The decoy tools the variant offers (metadata ``decoy_tools``), each a JSON object (name, description,
        input_schema)."""
        specs = self.metadata.get("decoy_tools") or []
        if not isinstance(specs, (list, tuple)) or not all(isinstance(spec, dict) for spec in specs):
            raise ConfigError(f"trial {self.trial_id}: decoy_tools must be a list of tool specs, not {specs!r}")
        return [dict(spec) for spec in specs if isinstance(spec, dict)]

    def headers(self) -> dict[str, str]:
        """W3C trace context and baggage for an HTTP call."""
        extra = {FAULT: str(self.fault)} if self.fault else None
        return {"traceparent": self.identity.traceparent(), "baggage": self.identity.baggage(extra)}

    def payload(self) -> dict[str, object]:
        """The JSON body the HTTP adapter sends."""
        return {"input": self.text, "trial": self.identity.as_dict(), "metadata": self.metadata,
                "fault": self.fault.as_dict() if self.fault else None,
                "traceparent": self.identity.traceparent(), "routes": dict(self.routes)}

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess agent: OTel carriers, resource attributes, PLUMBLINE_*."""
        env = dict(os.environ if base is None else base)
        ident = self.identity
        env["OTEL_RESOURCE_ATTRIBUTES"] = ident.resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES"))
        # The specification's environment carriers (what the SDKs' EnvironmentGetter reads): the attempt's trace, under its
        # virtual root, and its identity in baggage. A TRACESTATE the runner inherited belongs to another trace: dropped.
        env["TRACEPARENT"] = ident.traceparent()
        env.pop("TRACESTATE", None)
        env["BAGGAGE"] = ident.baggage({FAULT: str(self.fault)} if self.fault else None)
        env.update({
            "PLUMBLINE_TRIAL_ID": ident.trial_id, "PLUMBLINE_PERTURBATION": ident.perturbation,
            "PLUMBLINE_VARIANT": ident.variant, "PLUMBLINE_STUDY": ident.study,
            "PLUMBLINE_REPEAT": str(ident.repeat), "PLUMBLINE_TRIAL_ATTEMPT": str(ident.attempt),
            "PLUMBLINE_TASK_KEY": ident.task_key or "",
            "PLUMBLINE_TRIAL_METADATA": json.dumps(self.metadata, sort_keys=True, default=str),
        })
        if self.fault:
            env["PLUMBLINE_FAULT"] = str(self.fault)
        else:
            env.pop("PLUMBLINE_FAULT", None)
        if self.sink is not None and self.sink.endpoint:
            # each variable in the form the SDKs read it: the base URL (no /v1/traces), the full traces URL, the protocol
            from plumbline_otel.replay.otlp import resolve_endpoint

            env.update(resolve_endpoint(self.sink.endpoint).agent_env())
        if self.sink is not None and self.sink.otlp_file:
            env["PLUMBLINE_OTLP_FILE"] = str(self.sink.otlp_file)
        env.update(self.routes)  # OPENAI_BASE_URL, ANTHROPIC_BASE_URL, PLUMBLINE_MCP_URL: this attempt's proxy routes
        return env


@dataclass
class TrialOutcome:
    """What an adapter reports about a trial that ran (failures are raised instead)."""

    trace_id: str | None = None
    cost_usd: float | None = None  # None: unknown (metered model calls are counted anyway)
    output: str | None = None
    fault_fired: bool | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    detail: JsonObject = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: object) -> TrialOutcome:
        """An adapter's report as an outcome: a ``TrialOutcome``, a JSON object of its fields (others go to
        ``detail``), the agent's output as text, or None (nothing reported)."""
        if isinstance(value, TrialOutcome):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(output=value)
        if isinstance(value, Mapping):
            fields = cls.__dataclass_fields__
            known = {k: value[k] for k in fields if k in value and k != "detail"}
            detail = value.get("detail")
            extra = {**(dict(detail) if isinstance(detail, Mapping) else {}), **{k: v for k, v in value.items() if k not in fields}}
            # the adapter's JSON report: its fields as it wrote them (claims, never checked), the rest kept as detail
            return cls(**known, detail=cast(JsonObject, extra))
        raise AdapterError(f"an adapter returned {type(value).__name__}; expected TrialOutcome, dict, str or None")


class DomainTools(Protocol):
    """What planning reads of an adapter: a domain's decoys and preferred fault targets (`plan.plan_study`)."""

    @property
    def decoy_tools(self) -> Sequence[Mapping[str, object]]:
        """The domain's decoys (name, description, input_schema) for ``decoy_tools``; empty: the product's own."""
        ...

    @property
    def fault_tools(self) -> Sequence[str]:
        """Preferred fault targets (checks rather than effects), among the tools a task's source run called; empty: any."""
        ...


class Adapter(Protocol):
    """How the driver reaches the agent under test. ``run`` is the contract; every other member has a meaning and a
    default (`AdapterBase`), and is looked up nowhere but in `DeclaredAdapter`.

    Blocking and threads: ``run`` is called from the driver's worker threads, up to the study's concurrency at once, and
    blocks until the attempt ends; it raises `adapters.TransientAdapterError` only when the agent did not run (the
    driver retries), `adapters.AttemptInterrupted` when ``cancel`` stopped it, anything else when the agent ran and
    failed. ``cancel`` is called from the main thread while ``run`` calls are in flight; ``close`` once, after the study.
    """

    service: str | None
    """The agent's ``service.name`` on the driver's records (None: the study's ``--service``, else the task's)."""
    service_version: str | None
    """Its ``service.version`` there, used with ``service``."""
    decoy_tools: Sequence[Mapping[str, object]]
    """The domain's decoys (name, description, input_schema) for ``decoy_tools``; empty: the product's own."""
    fault_tools: Sequence[str]
    """Preferred fault targets (checks rather than effects), among the tools a task's source run called; empty: any."""
    grace_s: float
    """After ``cancel``, how long a stopped agent has to end before it is killed (said to the user)."""

    def run(self, trial: Trial) -> TrialOutcome:
        """Run the agent once for ``trial``'s attempt and report what it claims (see the class docstring)."""
        ...

    def describe(self) -> str | None:
        """One line naming the agent for the console; None: the adapter's spec is shown instead."""
        ...

    def cancel(self) -> int:
        """Stop every running agent (the runner is stopping); how many were running. 0: it cannot, they are waited for."""
        ...

    def close(self) -> None:
        """Release what the adapter holds (backends, exporters); called once, after the study."""
        ...


class AdapterBase(ABC):
    """The defaults of `Adapter`'s optional members: an adapter class inherits this and overrides what it has. ``run``
    has no default: a class that does not write it cannot be instantiated (a TypeError naming it), rather than failing
    at its first trial."""

    service: str | None = None
    service_version: str | None = None
    decoy_tools: Sequence[Mapping[str, object]] = ()
    fault_tools: Sequence[str] = ()
    grace_s: float = 5.0

    @abstractmethod
    def run(self, trial: Trial) -> TrialOutcome:
        """Run the agent once for ``trial``'s attempt and report what it claims (`Adapter.run`)."""

    def describe(self) -> str | None:
        return None

    def cancel(self) -> int:
        return 0

    def close(self) -> None:
        return None


@runtime_checkable
class Runs(Protocol):
    """The least an adapter object is: something with ``run`` (`adapters.adapter_of` fills in the rest)."""

    def run(self, trial: Trial) -> object: ...


@runtime_checkable
class _Service(Protocol):
    service: object


@runtime_checkable
class _ServiceVersion(Protocol):
    service_version: object


@runtime_checkable
class _Decoys(Protocol):
    decoy_tools: object


@runtime_checkable
class _FaultTools(Protocol):
    fault_tools: object


@runtime_checkable
class _Grace(Protocol):
    grace_s: object


@runtime_checkable
class _Describes(Protocol):
    def describe(self) -> object: ...


@runtime_checkable
class _Cancels(Protocol):
    def cancel(self) -> object: ...


@runtime_checkable
class _Closes(Protocol):
    def close(self) -> object: ...


class DeclaredAdapter(AdapterBase):
    """An adapter object that is not an `AdapterBase`, as an `Adapter`: the optional members it declares (their types
    checked once, here), the defaults for the rest. The driver and the command read only the `Adapter` contract."""

    def __init__(self, inner: Runs) -> None:
        self.inner = inner
        self.service = _text(inner.service) if isinstance(inner, _Service) else None
        self.service_version = _text(inner.service_version) if isinstance(inner, _ServiceVersion) else None
        decoys = inner.decoy_tools if isinstance(inner, _Decoys) else ()
        self.decoy_tools = tuple(d for d in decoys if isinstance(d, Mapping)) if isinstance(decoys, (list, tuple)) else ()
        tools = inner.fault_tools if isinstance(inner, _FaultTools) else ()
        self.fault_tools = tuple(str(t) for t in tools) if isinstance(tools, (list, tuple)) else ()
        grace = inner.grace_s if isinstance(inner, _Grace) else None
        self.grace_s = float(grace) if isinstance(grace, (int, float)) and not isinstance(grace, bool) else AdapterBase.grace_s

    def run(self, trial: Trial) -> TrialOutcome:
        return TrialOutcome.coerce(self.inner.run(trial))

    def describe(self) -> str | None:
        return _text(self.inner.describe()) if isinstance(self.inner, _Describes) and callable(self.inner.describe) else None

    def cancel(self) -> int:
        if not (isinstance(self.inner, _Cancels) and callable(self.inner.cancel)):
            return 0
        stopped = self.inner.cancel()
        return stopped if isinstance(stopped, int) else 0

    def close(self) -> None:
        if isinstance(self.inner, _Closes) and callable(self.inner.close):
            self.inner.close()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


class TrialRoute(Protocol):
    """One attempt's way into a proxy, handed to the agent (``Trial.routes``) as environment variables."""

    @property
    def token(self) -> str:
        """The random path token of this attempt's route (a straggler of an earlier attempt never reaches a later one)."""
        ...

    def env(self) -> dict[str, str]:
        """The variables an agent reads its endpoint from (``OPENAI_BASE_URL``, ``PLUMBLINE_MCP_URL``, …)."""
        ...


class Evidence(Protocol):
    """What a proxy witnessed in one attempt: the driver writes it into the attempt's record (never the agent's word).

    ``as_dict`` keys the driver reads (each optional): ``cache_hits`` (answered from the cassette), ``faults`` (faults
    the proxy injected and saw reach the agent), ``decoys_offered``, ``sampling_changes`` (a request perturbation
    seen), ``diverged`` (a branch-point replay left the recorded run: ``{step, detail}``), ``refused_budget``,
    ``refused_offline`` (plumbline's own refusals), and ``provider_failures``, ``server_died``, ``proxy_errors``
    (failures that were not the agent's: ``{detail, status, recovered}``)."""

    @property
    def witness(self) -> str:
        """Who saw it (``model_proxy``, ``mcp_proxy``): the key of its evidence in the record."""
        ...

    @property
    def calls(self) -> int:
        """Calls the agent made through this route; a model proxy that saw none means the agent was unrouted."""
        ...

    def as_dict(self) -> Mapping[str, object]:
        """The evidence as JSON."""
        ...


class TrialProxy(Protocol):
    """A witness in the agent's path, one per study, serving every attempt on its own route: what the driver calls.

    Threads: ``open_trial`` and ``close_trial`` are called from the driver's worker threads, concurrently for different
    attempts; ``close_trial`` waits (bounded) for calls of the route still being served, so their cost and faults are in
    its evidence, and routes nothing more for it. Starting and stopping (`loopback.LoopbackService`: ``start``,
    ``stop``, ``url``) are the command's, before the first attempt and after the last."""

    def open_trial(self, trial: Trial, budget: TrialBudget | None) -> TrialRoute:
        """Route one attempt: its plan from ``trial`` (metadata, fault), its spend from ``budget``."""
        ...

    def close_trial(self, route: TrialRoute) -> Evidence:
        """Stop routing the attempt; what the proxy witnessed in it."""
        ...


class BranchingProxy(TrialProxy, Protocol):
    """A proxy that serves a branch-point replay's prefix itself (issue 44): both of plumbline's proxies. The driver
    opens a branch-point trial's route with its ``tape``, and any other trial's as a `TrialProxy`'s."""

    def open_trial(self, trial: Trial, budget: TrialBudget | None, tape: Tape | None = None) -> TrialRoute:
        """Route one attempt; ``tape``: the recorded run whose prefix (before ``trial.branch_at``) the proxy answers."""
        ...
