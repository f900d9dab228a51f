"""Adapters: how the driver reaches the agent under test. The contract is `contracts.Adapter`:

    class Adapter(Protocol):
        def run(self, trial: Trial) -> TrialOutcome: ...   # an object's run, or a trial function, may return a dict,
                                                           # text or None: `TrialOutcome.coerce` reads it

and eight optional members, each with a meaning and a default (`contracts.AdapterBase`): ``service`` /
``service_version`` (the agent label on the driver's records), ``decoy_tools`` (the domain's decoys),
``fault_tools`` (preferred fault targets among the tools a task's source run called), ``grace_s`` and
``cancel()`` (stopping running agents when the runner is stopped), ``describe()`` (one line for the
console) and ``close()`` (after the study). The driver reads the first six and ``run``; the command also
``describe`` and ``close``. An adapter object that does not inherit `AdapterBase` is read through
`adapter_of` (what it declares, the defaults for the rest), a trial function becomes a ``PythonAdapter``.

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
from typing import TYPE_CHECKING, TypedDict, cast

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.contracts import (
    Adapter,
    AdapterBase,
    AdapterError,
    AttemptInterrupted,
    DeclaredAdapter,
    JsonObject,
    Runs,
    TransientAdapterError,
    Trial,
    TrialOutcome,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from types import FrameType

    from plumbline_otel.replay.scope import TrialScope

__all__ = ["EX_TEMPFAIL", "TRANSIENT_HTTP", "Adapter", "AdapterBase", "AdapterError", "AttemptInterrupted", "CommandAdapter",
           "HttpAdapter", "IsolatedAdapter", "PythonAdapter", "TransientAdapterError", "Trial", "TrialOutcome", "adapter_of",
           "load_adapter", "stop_on_sigterm"]


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a runner as Ctrl-C does (a KeyboardInterrupt in the main thread), so a service manager's stop
    records the started trials as interrupted instead of killing the runner with its trials unrecorded. Only from the
    main thread (where Python runs signal handlers); elsewhere nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C too, even when whatever started the runner in the background left SIGINT ignored (a shell does for `&`
    # without job control, and Python then never raises KeyboardInterrupt): a runner is stopped by either, always.
    signal.signal(signal.SIGINT, signal.default_int_handler)


TRANSIENT_HTTP = frozenset({408, 425, 429, 503})  # refused at the door: the agent did not run
EX_TEMPFAIL = 75


def adapter_of(value: Adapter | Runs | Callable[[Trial], object]) -> Adapter:
    """``value`` as an `Adapter`: an `AdapterBase` as it is; another object with ``run``, with the optional members
    it declares and the defaults for the rest (`contracts.DeclaredAdapter`); a function of the trial, in process."""
    if isinstance(value, AdapterBase):
        return value
    if isinstance(value, Runs):
        return DeclaredAdapter(value)
    return PythonAdapter(value)


class PythonAdapter(AdapterBase):
    """An in-process callable ``fn(trial) -> TrialOutcome | dict | str | None``."""

    def __init__(self, fn: Callable[[Trial], object], service: str | None = None, service_version: str | None = None) -> None:
        self.fn = fn
        self.service = service
        self.service_version = service_version

    def run(self, trial: Trial) -> TrialOutcome:
        return TrialOutcome.coerce(self.fn(trial))


class IsolatedAdapter(AdapterBase):
    """Run ``inner`` for each attempt in a forked child (see module docstring); its other members are ``inner``'s."""

    def __init__(self, inner: Adapter | Runs, timeout_s: float = 600.0) -> None:
        self.inner = adapter_of(inner)
        self.timeout_s = timeout_s
        self.service, self.service_version = self.inner.service, self.inner.service_version
        self.decoy_tools, self.fault_tools, self.grace_s = self.inner.decoy_tools, self.inner.fault_tools, self.inner.grace_s

    def describe(self) -> str | None:
        return self.inner.describe()

    def cancel(self) -> int:
        return self.inner.cancel()

    def close(self) -> None:
        self.inner.close()

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
        return report["outcome"] or TrialOutcome()


class _ChildReport(TypedDict):
    """What the child of an isolated attempt sends back through its pipe."""

    outcome: TrialOutcome | None
    error: str | None
    delivered: list[str]
    fired_calls: list[int]
    calls: tuple[int, int, int]
    budget: tuple[float, bool] | None
    abort_reason: str | None


def _adopt(scope: TrialScope, report: _ChildReport) -> None:
    """What the child's injector and meter saw becomes the driver's (the child ran the driver's own code)."""
    if scope.fault is not None:
        scope.fault.fired_calls[:] = report["fired_calls"]
    scope.model_calls, scope.cache_hits, scope.cache_misses = report["calls"]
    if scope.budget is not None and report["budget"] is not None:
        scope.budget.used, scope.budget.metered = report["budget"]
    scope.abort_reason = scope.abort_reason or report["abort_reason"]


def _isolated_attempt(inner: Adapter, trial: Trial, writer: Connection) -> None:
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
    report: _ChildReport = {
        "outcome": outcome, "error": error, "delivered": delivered,
        "fired_calls": list(scope.fault.fired_calls) if scope is not None and scope.fault is not None else [],
        "calls": (scope.model_calls, scope.cache_hits, scope.cache_misses) if scope is not None else (0, 0, 0),
        "budget": (scope.budget.used, scope.budget.metered) if scope is not None and scope.budget is not None else None,
        "abort_reason": scope.abort_reason if scope is not None else None,
    }
    writer.send(report)
    writer.close()
    os._exit(0)


def _last_json_line(text: str) -> JsonObject:
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


class CommandAdapter(AdapterBase):
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


class HttpAdapter(AdapterBase):
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


def load_adapter(spec: str, options: Mapping[str, object] | None = None) -> Runs:
    """An adapter from ``python:module:attr``, ``command:CMD`` or ``http:URL`` (or a bare http(s) URL).

    For ``python:``, ``attr`` may be an adapter object (has ``run``), a class (built with
    ``options``), a factory (called with ``options`` when there are any) or a trial function. What the user's code
    made is returned as it is; the driver reads it through `adapter_of`.
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
            return cast(Runs, target(**options))  # the user's adapter class, as it built it (`adapter_of` reads it)
        if isinstance(target, Runs):
            if options:
                raise ConfigError(f"--adapter {spec!r} is an adapter object; options apply to classes and factories")
            return target
        if options:
            return cast(Runs, target(**options))
        return PythonAdapter(target)
    if kind == "command":
        return CommandAdapter(rest, **options)  # type: ignore[arg-type]  # the user's --adapter-option values, checked by the class
    if kind in ("http", "https"):
        url = f"{kind}:{rest}" if rest.startswith("//") else rest
        return HttpAdapter(url, **options)  # type: ignore[arg-type]
    raise ConfigError(f"--adapter {spec!r}: expected python:module:callable, command:CMD or http:URL")
