"""Adapters: how the driver reaches the agent under test. One small protocol, three kinds.

    class Adapter(Protocol):
        def run(self, trial: Trial) -> TrialOutcome: ...

Optional members the driver reads (and nothing else): ``service`` / ``service_version`` (the agent
label on the driver's records), ``decoy_tools`` (the domain's decoys), ``fault_tools`` (preferred
fault targets among the tools a task's source run called), ``describe()`` (one line for the
console), ``cancel()`` and ``grace_s`` (stopping running agents when the runner is stopped), and
``close()``.

- ``PythonAdapter``: a callable in this process, ``fn(trial)``. The driver runs it inside the
  trial's OTel context (trace and baggage) and trial scope (cache, budget, fault).
- ``IsolatedAdapter``: any in-process adapter, each attempt in a forked child process, for agents
  that may ``os._exit``, abort or crash the interpreter: the child inherits the trial's scope, and
  hands back its outcome and what the injector and meter saw; a child that dies is an errored
  trial, never a dead runner (``--isolate``; spans through an OTLP file or OTLP/HTTP, which
  survive a fork, not OTLP/gRPC).
- ``CommandAdapter``: a subprocess per attempt. Identity (attempt and fault evidence included)
  in ``OTEL_RESOURCE_ATTRIBUTES``, ``TRACEPARENT``/``BAGGAGE`` (the OTel environment carriers)
  and ``PLUMBLINE_*`` variables;
  the variant text on stdin, or in place of ``{input}`` in the arguments. Exit 75 (EX_TEMPFAIL)
  is a transient failure. A last stdout line that is a JSON object may report ``trace_id``,
  ``cost_usd``, ``fault_fired`` and ``output``: claims, kept beside the driver's record (a
  ``trace_id`` that is not the attempt's own is a conflict; a cost can raise a charge, never lower it).
- ``HttpAdapter``: POSTs ``{input, trial, metadata, fault}`` as JSON with W3C ``traceparent`` and
  ``baggage`` headers; 408/425/429/503 and connection failures are transient (``Retry-After``
  honoured): the request was refused at the door. Any other error status means the agent ran and
  failed. A JSON response may report the same fields as the command adapter.

Transient errors are retried by the driver and recorded as attempts that never reached the agent
(missing), so an adapter raises one only when the agent did not run (a refused connection, a 503
at the door, exit 75). Whatever an adapter reports (``cost_usd``, ``fault_fired``) is kept as the
agent's claim beside the driver's record; it never decides a trial's status or exposure.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from plumbline_otel.errors import ConfigError, ReplayError
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.runs import FAULT

if TYPE_CHECKING:
    from plumbline_otel.replay.export import SpanSink
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


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a runner as Ctrl-C does (a KeyboardInterrupt in the main thread), so a service manager's stop
    records the started trials as interrupted instead of killing the runner with its trials unrecorded. Only from the
    main thread (where Python runs signal handlers); elsewhere nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)


TRANSIENT_HTTP = frozenset({408, 425, 429, 503})  # refused at the door: the agent did not run
EX_TEMPFAIL = 75


@dataclass(frozen=True)
class Trial:
    """One run to make: who (identity), what (text, metadata, fault), where spans go (sink)."""

    identity: TrialIdentity
    task: ReplayTask
    text: str
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    fault: FaultPlan | None = None
    sink: SpanSink | None = field(default=None, hash=False, compare=False)
    routes: dict[str, str] = field(default_factory=dict, hash=False, compare=False)  # the attempt's proxy URLs, as env variables

    @property
    def trial_id(self) -> str:
        return self.identity.trial_id

    @property
    def trace_id(self) -> str:
        return self.identity.trace_id

    def headers(self) -> dict[str, str]:
        """W3C trace context and baggage for an HTTP call."""
        extra = {FAULT: str(self.fault)} if self.fault else None
        return {"traceparent": self.identity.traceparent(), "baggage": self.identity.baggage(extra)}

    def payload(self) -> dict[str, Any]:
        """The JSON body the HTTP adapter sends."""
        return {"input": self.text, "trial": self.identity.as_dict(), "metadata": self.metadata,
                "fault": self.fault.as_dict() if self.fault else None,
                "traceparent": self.identity.traceparent(), "routes": self.routes}

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess agent: OTel carriers, resource attributes, PLUMBLINE_*."""
        env = dict(os.environ if base is None else base)
        ident = self.identity
        env["OTEL_RESOURCE_ATTRIBUTES"] = ident.resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES"))
        env["TRACEPARENT"] = ident.traceparent()
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
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Any) -> TrialOutcome:
        if isinstance(value, TrialOutcome):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(output=value)
        if isinstance(value, Mapping):
            known = {k: value[k] for k in cls.__dataclass_fields__ if k in value and k != "detail"}
            rest = {k: v for k, v in value.items() if k not in cls.__dataclass_fields__}
            return cls(**known, detail={**dict(value.get("detail") or {}), **rest})
        raise AdapterError(f"an adapter returned {type(value).__name__}; expected TrialOutcome, dict, str or None")


@runtime_checkable
class Adapter(Protocol):
    def run(self, trial: Trial) -> TrialOutcome: ...


class PythonAdapter:
    """An in-process callable ``fn(trial) -> TrialOutcome | dict | str | None``."""

    def __init__(self, fn: Callable[[Trial], Any], service: str | None = None, service_version: str | None = None) -> None:
        self.fn = fn
        self.service = service
        self.service_version = service_version

    def run(self, trial: Trial) -> TrialOutcome:
        return TrialOutcome.coerce(self.fn(trial))


class IsolatedAdapter:
    """Run ``inner`` for each attempt in a forked child (see module docstring)."""

    def __init__(self, inner: Any, timeout_s: float = 600.0) -> None:
        self.inner = inner
        self.timeout_s = timeout_s

    def __getattr__(self, name: str) -> Any:  # service, decoy_tools, fault_tools, describe, … of the agent
        return getattr(self.inner, name)

    def run(self, trial: Trial) -> TrialOutcome:
        import multiprocessing

        from plumbline_otel.replay.scope import current_scope

        context = multiprocessing.get_context("fork")
        reader, writer = context.Pipe(duplex=False)
        child = context.Process(target=_isolated_attempt, args=(self.inner, trial, writer), daemon=True)
        child.start()
        writer.close()
        try:
            report = reader.recv() if reader.poll(self.timeout_s) else None
        except EOFError:
            report = None  # it died before it could say anything
        child.join(1.0 if report is not None else 0.0)
        if child.is_alive():
            child.kill()
            child.join()
        if report is None:
            if child.exitcode is None or child.exitcode == -9:
                raise AdapterError(f"agent process timed out after {self.timeout_s:g}s (killed)")
            raise AdapterError(f"agent process exited with code {child.exitcode} before it returned")
        scope = current_scope()
        if scope is not None:
            _adopt(scope, report)
        if trial.sink is not None:
            trial.sink.delivered(report["delivered"])
        if report["error"] is not None:
            raise AdapterError(report["error"])
        outcome: TrialOutcome = report["outcome"]
        return outcome


def _adopt(scope: Any, report: dict[str, Any]) -> None:
    """What the child's injector and meter saw becomes the driver's (the child ran the driver's own code)."""
    if scope.fault is not None:
        scope.fault.fired_calls[:] = report["fired_calls"]
    scope.model_calls, scope.cache_hits, scope.cache_misses = report["calls"]
    if scope.budget is not None and report["budget"] is not None:
        scope.budget.used, scope.budget.metered = report["budget"]
    scope.abort_reason = scope.abort_reason or report["abort_reason"]


def _isolated_attempt(inner: Any, trial: Trial, writer: Any) -> None:
    """The child: run the attempt, flush its spans, report, and leave without running the parent's exit handlers."""
    from plumbline_otel.replay.scope import current_scope

    error: str | None = None
    outcome: TrialOutcome | None = None
    try:
        outcome = TrialOutcome.coerce(inner.run(trial))
    except BaseException as exc:  # SystemExit included: the child reports it, then ends
        error = f"{type(exc).__name__}: {exc}"
    delivered: list[str] = []
    if trial.sink is not None:
        delivered = trial.sink.flush_delivered()
    scope = current_scope()
    writer.send({
        "outcome": outcome, "error": error, "delivered": delivered,
        "fired_calls": list(scope.fault.fired_calls) if scope is not None and scope.fault is not None else [],
        "calls": (scope.model_calls, scope.cache_hits, scope.cache_misses) if scope is not None else (0, 0, 0),
        "budget": (scope.budget.used, scope.budget.metered) if scope is not None and scope.budget is not None else None,
        "abort_reason": scope.abort_reason if scope is not None else None,
    })
    writer.close()
    os._exit(0)


def _last_json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
        if line:
            return {}
    return {}


class CommandAdapter:
    """One subprocess per trial (see module docstring)."""

    def __init__(self, command: str | list[str], timeout_s: float = 600.0, service: str | None = None,
                 service_version: str | None = None, cwd: str | None = None) -> None:
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise ConfigError("command adapter: empty command")
        self.timeout_s = timeout_s
        self.service = service
        self.service_version = service_version
        self.cwd = cwd
        self.grace_s = 5.0  # after `cancel`'s SIGTERM, how long an agent has to end before SIGKILL
        self._running: set[subprocess.Popen[str]] = set()
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def cancel(self) -> int:
        """Stop every running agent (the runner is stopping): SIGTERM to each one's process group, SIGKILL to those still
        there after ``grace_s``; their attempts raise `AttemptInterrupted`, and no new one starts. How many were running."""
        self._cancelled.set()
        with self._lock:
            running = list(self._running)
        for proc in running:
            _signal_group(proc, signal.SIGTERM)

        def kill_survivors() -> None:
            deadline = time.monotonic() + self.grace_s
            for proc in running:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)

        threading.Thread(target=kill_survivors, name="plumbline-stop-agents", daemon=True).start()
        return len(running)

    def run(self, trial: Trial) -> TrialOutcome:
        as_arg = any("{input}" in a for a in self.argv)
        argv = [a.replace("{input}", trial.text) for a in self.argv]
        if self._cancelled.is_set():
            raise AttemptInterrupted("not started: the runner is stopping")
        try:
            # A session of its own: a Ctrl-C at the terminal reaches the runner, which stops its agents itself (`cancel`).
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if as_arg else subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=trial.env(), cwd=self.cwd, start_new_session=True)
        except FileNotFoundError as exc:
            raise AdapterError(f"command not found: {argv[0]}") from exc
        with self._lock:
            self._running.add(proc)
        try:
            stdout, stderr = proc.communicate(input=None if as_arg else trial.text, timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            _signal_group(proc, signal.SIGKILL)
            proc.communicate()
            raise AdapterError(f"command timed out after {self.timeout_s:g}s") from exc
        finally:
            with self._lock:
                self._running.discard(proc)
        if self._cancelled.is_set():
            raise AttemptInterrupted(f"the runner was stopped during the attempt; its agent was stopped (exit {proc.returncode})")
        done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        if done.returncode == EX_TEMPFAIL:
            raise TransientAdapterError(f"command exited {EX_TEMPFAIL} (temporary failure): {done.stderr.strip()[-300:]}")
        if done.returncode != 0:
            raise AdapterError(f"command exited {done.returncode}: {done.stderr.strip()[-300:]}")
        report = _last_json_line(done.stdout)
        outcome = TrialOutcome.coerce(report) if report else TrialOutcome(output=done.stdout.strip()[-2000:] or None)
        outcome.trace_id = outcome.trace_id or trial.trace_id
        return outcome


def _signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    """Send ``sig`` to the agent's process group (it and whatever it started), if it is still there."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class HttpAdapter:
    """POST the trial to an HTTP endpoint (see module docstring)."""

    def __init__(self, url: str, timeout_s: float = 600.0, headers: Mapping[str, str] | None = None,
                 service: str | None = None, service_version: str | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.extra_headers = dict(headers or {})
        self.service = service
        self.service_version = service_version

    def run(self, trial: Trial) -> TrialOutcome:
        body = json.dumps(trial.payload(), default=str).encode()
        headers = {"content-type": "application/json", **trial.headers(), **self.extra_headers}
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - URL given by the user
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            if exc.code in TRANSIENT_HTTP:
                raise TransientAdapterError(f"HTTP {exc.code} from {self.url}: {detail}",
                                            _retry_after(exc.headers.get("Retry-After"))) from exc
            raise AdapterError(f"HTTP {exc.code} from {self.url}: {detail}") from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TransientAdapterError(f"cannot reach {self.url}: {reason}") from exc
        try:
            report = json.loads(text) if text.strip() else {}
        except ValueError:
            report = {"output": text[:2000]}
        outcome = TrialOutcome.coerce(report if isinstance(report, dict) else {"output": str(report)})
        outcome.trace_id = outcome.trace_id or trial.trace_id
        return outcome


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def load_adapter(spec: str, options: Mapping[str, Any] | None = None) -> Any:
    """An adapter from ``python:module:attr``, ``command:CMD`` or ``http:URL`` (or a bare http(s) URL).

    For ``python:``, ``attr`` may be an adapter object (has ``run``), a class (built with
    ``options``), a factory (called with ``options`` when there are any) or a trial function.
    """
    options = dict(options or {})
    kind, _, rest = spec.partition(":")
    if kind == "python":
        module_name, _, attr = rest.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"--adapter {spec!r}: expected python:module:callable")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--adapter {spec!r}: {exc}") from exc
        if inspect.isclass(target):
            return target(**options)
        if hasattr(target, "run"):
            if options:
                raise ConfigError(f"--adapter {spec!r} is an adapter object; options apply to classes and factories")
            return target
        if options:
            return target(**options)
        return PythonAdapter(target)
    if kind == "command":
        return CommandAdapter(rest, **options)
    if kind in ("http", "https"):
        url = f"{kind}:{rest}" if rest.startswith("//") else rest
        return HttpAdapter(url, **options)
    raise ConfigError(f"--adapter {spec!r}: expected python:module:callable, command:CMD or http:URL")
