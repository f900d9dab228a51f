"""The accounts-payable arms as replay adapters: ``plumbline replay --adapter python:…:react``.

    python:domains.accounts_payable.replay_adapter:react               the free-form agent
    python:domains.accounts_payable.replay_adapter:plan_execute        no retry
    python:domains.accounts_payable.replay_adapter:plan_execute_retry  with retry
    python:domains.accounts_payable.replay_adapter:APAdapter  + --adapter-option arm=… live=true …

Each trial runs ``run_trial`` with the variant's text, its sampling temperature (sent in the
request body) and its decoy tools (appended to the tools a request offers; a call to one fails as
an unknown tool), under the attempt's identity. Its fault is the driver's: the arms' tool runner
asks the driver's per-attempt injector before every call, and the root span carries the fault
evidence the driver recorded (``plumbline.fault.tool`` / ``.error`` / ``.fired``). Spans go to the study's sink
(an OTLP endpoint such as a running ``plumbline serve``, or an OTLP JSON-lines file), all or
nothing per trial: an attempt that fails is discarded, so a retry or a missing marker stands for
it. The agent joins the driver's trace context, so its trace is the trial's trace.

The model is the SIMULATED one by default (``simulated-ap-policy-v1`` behind the loopback
stand-in of the Anthropic API; every outcome says ``simulated``). ``live=True`` uses the real
API (``ANTHROPIC_API_KEY``), ``model_url`` any Messages-compatible server. Model calls go
through the real ``anthropic`` client with the replay response cache as its transport, keyed by
trial identity, so a study replays offline from its recorded responses.
"""

from __future__ import annotations

import re
import threading
from contextlib import ExitStack
from typing import Any

from domains.accounts_payable import tracing
from domains.accounts_payable.arms import ARMS, TRANSIENT_KINDS, run_trial
from domains.accounts_payable.run import Backend, model_backend
from plumbline_otel.replay import (
    AdapterBase,
    AdapterError,
    SpanSink,
    TransientAdapterError,
    Trial,
    TrialOutcome,
    TrialSpanBuffer,
    anthropic_client,
)

# Plausible for an AP agent, needed by no task: what the decoy_tools perturbation offers here.
AP_DECOY_TOOLS: tuple[dict[str, Any], ...] = (
    {"name": "lookup_tax_code", "description": "Look up the tax code normally used for a stock item (SKU).",
     "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}},
    {"name": "estimate_freight", "description": "Estimate the freight cost of delivering a purchase order.",
     "input_schema": {"type": "object", "properties": {"po_id": {"type": "string"}}, "required": ["po_id"]}},
    {"name": "check_budget_remaining", "description": "Remaining budget of a cost centre this quarter.",
     "input_schema": {"type": "object", "properties": {"cost_centre": {"type": "string"}}, "required": ["cost_centre"]}},
)
# Where tool_fault injects by default: checks that most documents go through, never a payment
# (the same target as the demo study first); only tools the task's source run called are used.
AP_FAULT_TOOLS = ("check_duplicate", "check_vendor_status", "three_way_match", "validate_po")
# The demo's simulated agents are plausibly imperfect: they sometimes skip a check when
# distracted, sometimes give up after a transient error, rarely misread an amount or pick the
# wrong reason code (see simulated_model.py).
DEMO_IMPERFECTIONS = {"skip_check_under_distraction": 0.3, "stop_retrying": 0.3, "misread_amount": 0.03, "wrong_reason_code": 0.05}
_DOC_ID = re.compile(r"\bINV-\d{3,}\b", re.I)


class _Messages:
    def __init__(self, inner: Any, decoys: list[dict[str, Any]], extra_body: dict[str, Any]) -> None:
        self._inner, self._decoys, self._extra_body = inner, decoys, extra_body

    def create(self, **kwargs: Any) -> Any:
        if self._decoys and kwargs.get("tools"):
            names = {t.get("name") for t in kwargs["tools"]}
            kwargs["tools"] = [*kwargs["tools"], *(d for d in self._decoys if d["name"] not in names)]
        if self._extra_body:
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **self._extra_body}
        return self._inner.create(**kwargs)


class _Perturbed:
    """The client, with decoy tools appended to every request that offers tools, and sampling
    parameters sent in the body (the installed SDK's ``messages.create`` has no ``temperature``)."""

    def __init__(self, client: Any, decoys: list[dict[str, Any]], extra_body: dict[str, Any]) -> None:
        self._client = client
        self.messages = _Messages(client.messages, decoys, extra_body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _transient(exc: BaseException) -> bool:
    import anthropic

    return isinstance(exc, (anthropic.APIConnectionError, anthropic.RateLimitError, anthropic.InternalServerError))


class APAdapter(AdapterBase):
    """One AP arm as a replay adapter (thread-safe; the model backend starts on first use): its label, the domain's
    decoys and preferred fault targets, and ``describe``/``close`` (`replay.contracts.Adapter`)."""

    def __init__(self, arm: str = "react", *, live: bool | str = False, model: str | None = None,
                 model_url: str | None = None, imperfections: str | dict[str, float] | None = None,
                 seed: int | str = 0, capture_content: bool | str = True, exporter: Any | None = None) -> None:
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
        self.arm = arm
        self.service = f"ap-agent-{arm}"
        self.service_version = tracing.SERVICE_VERSION
        self.decoy_tools = AP_DECOY_TOOLS
        self.fault_tools = AP_FAULT_TOOLS
        self.live = _flag(live)
        self.model, self.model_url, self.imperfections, self.seed = model, model_url, imperfections, int(seed)
        self.capture_content = _flag(capture_content)
        self.exporter = exporter  # overrides the trial's sink (tests)
        self._lock = threading.Lock()
        self._stack: ExitStack | None = None
        self._backend: Backend | None = None
        self._client: Any = None
        self._providers: dict[int, tuple[Any, TrialSpanBuffer, SpanSink | None]] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def _start(self) -> tuple[Backend, Any]:
        with self._lock:
            if self._backend is None:
                stack = ExitStack()
                backend = stack.enter_context(model_backend(
                    model=self.model, model_url=self.model_url, offline=not self.live,
                    imperfections=self.imperfections, seed=self.seed))
                simulated = backend.simulated
                self._client = anthropic_client(backend.base_url, api_key="offline-standin" if simulated else None,
                                                max_retries=0 if simulated else 2)
                self._stack, self._backend = stack, backend
            return self._backend, self._client

    @property
    def backend_kind(self) -> str:
        """``simulated``, ``anthropic`` or ``url`` (starts the backend if needed)."""
        return self._start()[0].kind

    def describe(self) -> str:
        backend, _ = self._start()
        label = " (SIMULATED model: a seeded policy, not an LLM)" if backend.simulated else ""
        return f"accounts_payable {self.arm} on {backend.model}{label}"

    def close(self) -> None:
        with self._lock:
            for provider, _, _ in self._providers.values():
                provider.shutdown()
            self._providers.clear()
            if self._stack is not None:
                self._stack.close()
            self._stack, self._backend, self._client = None, None, None

    def _provider(self, trial: Trial) -> tuple[Any, TrialSpanBuffer]:
        sink = trial.sink
        key = id(self.exporter) if self.exporter is not None else id(sink)
        with self._lock:
            if key not in self._providers:
                if self.exporter is not None:
                    exporter = self.exporter
                elif sink is not None:
                    exporter = sink.exporter()
                else:
                    raise AdapterError("the accounts_payable adapter needs a span sink (--otlp-file or --endpoint)")
                provider = tracing.make_tracer_provider(self.arm)  # resource only; the buffer exports
                buffer = TrialSpanBuffer(exporter)
                provider.add_span_processor(buffer)
                self._providers[key] = (provider, buffer, sink)
            provider, buffer, _ = self._providers[key]
            return provider, buffer

    # --- one trial ------------------------------------------------------------------------

    @staticmethod
    def task_id_of(trial: Trial) -> str:
        from domains.accounts_payable.tasks import TASKS_BY_ID

        key = (trial.identity.task_key or "").upper()
        if key in TASKS_BY_ID:
            return key
        found = _DOC_ID.search(trial.text)
        if found and found.group(0).upper() in TASKS_BY_ID:
            return found.group(0).upper()
        raise AdapterError(f"trial {trial.trial_id}: task {trial.identity.task_key!r} is not an accounts_payable task")

    def run(self, trial: Trial) -> TrialOutcome:
        backend, client = self._start()
        provider, buffer = self._provider(trial)
        task_id = self.task_id_of(trial)
        if trial.fault is not None and trial.fault.kind not in TRANSIENT_KINDS:
            raise AdapterError(f"fault kind {trial.fault.kind!r} is not one of {', '.join(TRANSIENT_KINDS)}")
        decoys = trial.decoy_specs()
        sampling = {"temperature": trial.metadata["temperature"]} if trial.metadata.get("temperature") is not None else {}
        try:
            result = run_trial(
                self.arm, task_id, client=_Perturbed(client, decoys, sampling) if decoys or sampling else client,
                model=backend.model, trial=trial.identity, request_text=trial.text, tracer_provider=provider,
                capture_content=self.capture_content)
        except Exception as exc:
            buffer.discard(trial.trace_id)
            if _transient(exc):
                raise TransientAdapterError(f"{type(exc).__name__}: {exc}") from exc
            raise
        buffer.release(result.trace_id)
        return TrialOutcome(
            trace_id=result.trace_id, output=result.final_answer,
            fault_fired=result.fault_fired if trial.fault is not None else None,
            input_tokens=result.input_tokens, output_tokens=result.output_tokens,
            detail={"passed": result.passed, "backend": backend.kind, "simulated": backend.simulated,
                    "model": backend.model, "agent_error": result.agent_error})


def _flag(value: bool | str) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


# Ready-made adapters, one per arm, on the simulated model.
react = APAdapter("react")
plan_execute = APAdapter("plan_execute")
plan_execute_retry = APAdapter("plan_execute_retry")
