"""Toy agents written to cheat the witness, one body for every adapter kind (scripted, no model): each mode is a
way an agent under test could try to change its certificate with bytes it writes, beside its honest twin.

    python -m tests.replay.cheats MODE          (a command agent: the request on stdin, a JSON report on stdout)
    http:URL of `serve_http()`, the mode in the URL path
    python:tests.replay.cheats:InProcess        (--adapter-option mode=MODE)

Every mode reads the trial's identity the way a real agent can (``TRACEPARENT`` / the ``traceparent`` header,
``OTEL_RESOURCE_ATTRIBUTES``, the study's OTLP file named in ``PLUMBLINE_OTLP_FILE``) and exports through a real
OTel SDK exporter. The modes:

``pays`` / ``skips``  honest twins: a run that pays the invoice (conforming) or never pays (violating)
``silent``            an honest agent whose exporter lost its spans (exports nothing, names nothing)
``crash``             an honest agent that pays, then exits 1
``forge_ok_crash``    exports a conforming run, then a span dressed as the driver's "ok" record, then exits 1
``forge_many``        skips paying, and exports 25 invented trials of its study: a plan and an "ok" record each,
                      and a conforming run for each
``point``             exports nothing and names, as its run, a conforming trace it found in an OTLP file beside its own
``relabel``           skips paying, and stamps its run with another study, task, perturbation and trial
``free``              pays, and reports it cost $0 (the honest twin reports nothing)
``late``              skips paying, then leaves a detached child (a forked process, or in-process a thread) that
                      exports a ``pay`` step into its trace 3 s after the trial ended
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from plumbline_otel.replay import Trial, TrialOutcome
from plumbline_otel.replay.export import OtlpJsonFileExporter

MODES = ("pays", "skips", "silent", "crash", "late", "forge_ok_crash", "forge_many", "point", "relabel", "free")
ROOT_NAME = "invoke_agent cheat"


def _pairs(text: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` / ``baggage`` text as a map."""
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key.strip():
            out[key.strip()] = unquote(value.split(";")[0].strip())
    return out


def _provider(otlp_file: str, resource: Mapping[str, Any]) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "toy-agent", "service.version": "1", **resource}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(otlp_file)))
    return provider


def _run(tracer: trace.Tracer, context: Any, task: str, pays: bool, attrs: Mapping[str, Any] | None = None) -> None:
    """One agent run: look the invoice up, and pay it when `pays`."""
    with tracer.start_as_current_span(ROOT_NAME, context=context, attributes={"gen_ai.operation.name": "invoke_agent", **(attrs or {})}):
        for tool in ("lookup_invoice", "pay") if pays else ("lookup_invoice",):
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": json.dumps({"invoice_id": task}), "gen_ai.tool.call.result": '{"ok": true}'}):
                pass


def _fresh_context() -> Any:
    """A trace of the agent's own choosing (random, so it is no trial's)."""
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(secrets.randbits(127) | 1, secrets.randbits(63) | 1, is_remote=True,
                                                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))))


def _forged_record(tracer: trace.Tracer, identity: Mapping[str, str], status: str, kind: str, run_trace: str | None) -> None:
    """A span dressed as the driver's record: every attribute the driver writes, and a MAC the agent made up."""
    attrs: dict[str, Any] = {**identity, "plumbline.record.kind": kind, "plumbline.trial.status": status, "plumbline.record.at_ns": 1,
             "plumbline.cost.usd": 0.0, "plumbline.cost.metered": True, "plumbline.fault.fired": True,
             "plumbline.fault.source": "injector", "plumbline.record.mac": secrets.token_hex(32)}
    if run_trace:
        attrs["plumbline.trial.trace_id"] = run_trace
    with tracer.start_as_current_span("plumbline.trial.record", context=_fresh_context(), attributes=attrs):
        pass


def _other_trace(otlp_file: str, mine: str) -> str:
    """A conforming run's trace some other trial left in an OTLP file beside the study's (any agent can read them), or a random one."""
    text = "".join(p.read_text() for p in sorted(Path(otlp_file).parent.glob("*.jsonl")))
    found = [t for t in re.findall(r'"traceId":\s*"([0-9a-f]{32})"[^}]*?"name":\s*"execute_tool pay"', text) if t != mine]
    return found[0] if found else secrets.token_hex(16)


def act(mode: str, traceparent: str, resource_text: str, otlp_file: str) -> tuple[int, dict[str, Any]]:
    """What the agent does and says: (exit code, its JSON report)."""
    identity = {k: v for k, v in _pairs(resource_text).items() if k.startswith("plumbline.")}
    task = identity.get("plumbline.task.key", "")
    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    mine = traceparent.split("-")[1]
    resource = dict(identity)
    if mode == "relabel":
        resource.update({"plumbline.study": "elsewhere", "plumbline.task.key": "T-other", "plumbline.perturbation": "paraphrase",
                         "plumbline.trial.id": "elsewhere/T-other/paraphrase/0/k0"})
    provider = _provider(otlp_file, resource)
    tracer = provider.get_tracer("cheat")
    report: dict[str, Any] = {"output": "done"}
    code = 0
    if mode in ("pays", "free", "crash", "forge_ok_crash"):
        _run(tracer, context, task, pays=True)
    elif mode in ("skips", "forge_many", "late"):
        _run(tracer, context, task, pays=False)
    elif mode == "relabel":
        _run(tracer, context, task, pays=False, attrs={k: v for k, v in resource.items() if k.startswith("plumbline.")})
    elif mode == "point":
        report["trace_id"] = _other_trace(otlp_file, mine)
    if mode == "forge_ok_crash":
        _forged_record(tracer, identity, "ok", "attempt", mine)
    if mode in ("crash", "forge_ok_crash"):
        code = 1
    if mode == "forge_many":
        study = identity.get("plumbline.study", "")
        for i in range(25):
            invented = {**identity, "plumbline.trial.id": f"{study}/T-forged-{i}/baseline/0/k0", "plumbline.task.key": f"T-forged-{i}",
                        "plumbline.perturbation": "baseline", "plumbline.trial.attempt": "1"}
            run_context = _fresh_context()
            run_trace = format(trace.get_current_span(run_context).get_span_context().trace_id, "032x")
            _run(tracer, run_context, f"T-forged-{i}", pays=True, attrs=invented)
            _forged_record(tracer, invented, "planned", "plan", None)
            _forged_record(tracer, invented, "ok", "attempt", run_trace)
    if mode == "free":
        report["cost_usd"] = 0.0
    provider.shutdown()
    if mode == "late":
        _later(lambda: _late_pay(otlp_file, resource, context, task))
    return code, report


def _late_pay(otlp_file: str, resource: Mapping[str, Any], context: Any, task: str) -> None:
    provider = _provider(otlp_file, resource)
    with provider.get_tracer("cheat").start_as_current_span("execute_tool pay", context=context, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": json.dumps({"invoice_id": task}),
            "gen_ai.tool.call.result": '{"ok": true}'}):
        pass
    provider.shutdown()


def _later(work: Any, delay_s: float = 3.0) -> None:
    """Run `work` after the trial has ended: in a forked, detached child of a command agent (stdio closed, so its
    parent's exit ends the attempt), or on a thread of an in-process one."""
    if LATE_IN_THREAD:
        threading.Timer(delay_s, work).start()
        return
    if os.fork() == 0:
        try:
            os.setsid()
            for fd in (0, 1, 2):
                os.close(fd)
            time.sleep(delay_s)
            work()
        finally:
            os._exit(0)


LATE_IN_THREAD = True  # a command agent's main() forks instead


class InProcess:
    """The same cheats as a `python:` adapter: the trial's carriers as a process agent would see them."""

    def __init__(self, mode: str = "pays") -> None:
        self.mode = mode

    def run(self, trial: Trial) -> TrialOutcome:
        env = trial.env({})
        code, report = act(self.mode, env["TRACEPARENT"], env["OTEL_RESOURCE_ATTRIBUTES"], env["PLUMBLINE_OTLP_FILE"])
        if code:
            raise RuntimeError(f"the agent exited {code}")
        return TrialOutcome(output=report.get("output"), trace_id=report.get("trace_id"), cost_usd=report.get("cost_usd"))


class _Handler(BaseHTTPRequestHandler):
    otlp_file = ""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        resource = ",".join(f"{k}={v}" for k, v in _pairs(self.headers.get("baggage") or "").items())
        code, report = act(self.path.strip("/"), self.headers["traceparent"], resource, self.otlp_file)
        body = json.dumps(report if not code else {"error": "the agent crashed"}).encode()
        self.send_response(500 if code else 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve_http(otlp_file: str) -> Iterator[str]:
    """An HTTP agent on loopback running the cheats (the mode is the URL's path): its base URL."""
    handler = type("Handler", (_Handler,), {"otlp_file": otlp_file})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main(mode: str) -> int:
    global LATE_IN_THREAD
    LATE_IN_THREAD = False
    sys.stdin.read()
    code, report = act(mode, os.environ["TRACEPARENT"], os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), os.environ["PLUMBLINE_OTLP_FILE"])
    print(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
