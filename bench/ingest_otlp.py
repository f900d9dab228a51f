"""Ingest benchmark: GenAI-shaped spans over OTLP/gRPC into `plumbline serve`, and into Arize Phoenix under the same load.

    python bench/ingest_otlp.py [--duration 20] [--procs 4] [--threads 2] [--batch 512]
                                [--phoenix-python /tmp/phoenix-venv/bin/python | --no-phoenix]

Several exporter processes send ExportTraceServiceRequests of ~1 KB GenAI spans (agent, chat with
messages, execute_tool with arguments and results; 8 spans per trace, fresh ids every request)
as fast as the server takes them, each honouring pushback (RetryInfo from the trailer
`google.rpc.retryinfo-bin`, else 1 s). The requests are encoded once per process and only the ids
change, so the load generators spend their CPU on sending, not on the SDK.

Reported per server: spans/s *committed* (plumbline: `plumbline_spans_stored_total` from /metrics,
which counts only committed rows; Phoenix: `count(*)` of its `spans` table), measured between the
end of a warm-up and the end of the run; spans acknowledged; pushbacks; peak RSS of the server
process tree. Then the ratio. Before the load, the floor `bench/ingest_files.py` measures (a bare
protobuf decode reading every attribute), on this bench's own requests, and serve's committed rate as
a share of it. Phoenix (`pip install arize-phoenix` in its own venv, e.g. `python -m venv
/tmp/phoenix-venv && /tmp/phoenix-venv/bin/pip install arize-phoenix`) is started with its gRPC port bound to 127.0.0.1. Results also go to bench/out/ingest_otlp.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plumbline_otel import _native
from plumbline_otel.pipeline import spooled_bytes

REPO = Path(__file__).resolve().parents[1]
_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

_PHOENIX_WRAPPER = """
import sys
import grpc.aio._server as _server
_add = _server.Server.add_insecure_port
_server.Server.add_insecure_port = lambda self, address: _add(self, address.replace("[::]", "127.0.0.1"))
from phoenix.server.main import main
sys.argv = ["phoenix", "serve"]
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- load ------------------------------------------------------------------------------------

def _template(batch: int) -> Any:
    """One request of `batch` spans shaped like an agent's: ~1 KB each, tool args/results, messages."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in (("service.name", "bench-agent"), ("service.version", "1.4.2"), ("deployment.environment", "bench")):
        resource_spans.resource.attributes.add(key=key).value.string_value = value
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "opentelemetry.instrumentation.genai"
    now = time.time_ns()

    def span(name: str, attrs: dict[str, Any]) -> None:
        s = scope.spans.add(name=name, kind=1, start_time_unix_nano=now, end_time_unix_nano=now + 5_000_000)
        for key, value in attrs.items():
            kv = s.attributes.add(key=key)
            if isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.string_value = value

    for i in range(batch):
        n = i % 8
        if n == 0:
            span("invoke_agent payer", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer",
                                        "gen_ai.conversation.id": f"INV-{i}",
                                        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"Pay invoice INV-{i} if it matches its purchase order. " * 4}]}])})
        elif n in (1, 4, 7):
            span("chat claude", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-x", "gen_ai.provider.name": "anthropic",
                                 "gen_ai.usage.input_tokens": 812, "gen_ai.usage.output_tokens": 64,
                                 "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Check the invoice against PO-88 lines and tolerances. " * 6}]}]),
                                 "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{i}", "name": "get_invoice", "arguments": {"invoice_id": f"INV-{i}"}}]}])})
        else:
            span("execute_tool get_invoice", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_invoice", "gen_ai.tool.call.id": f"call_{i}",
                                              "gen_ai.tool.call.arguments": json.dumps({"invoice_id": f"INV-{i}", "include_lines": True, "currency": "EUR"}),
                                              "gen_ai.tool.call.result": json.dumps({"invoice_id": f"INV-{i}", "vendor": "Acme GmbH", "amount": "4820.00", "lines": [{"sku": f"SKU-{j}", "qty": j + 1, "unit_price": "120.50", "description": "Industrial widget, grade A"} for j in range(4)]})})
    return request


def _fresh_ids(request: Any) -> bytes:
    spans = request.resource_spans[0].scope_spans[0].spans
    trace_id = b""
    for i, s in enumerate(spans):
        if i % 8 == 0:
            trace_id = os.urandom(16)
            root = os.urandom(8)
            s.span_id, s.trace_id, s.parent_span_id = root, trace_id, b""
        else:
            s.trace_id, s.span_id, s.parent_span_id = trace_id, os.urandom(8), root
    return request.SerializeToString()


def _worker(address: str, seconds: float, batch: int, threads: int, results: Any) -> None:
    import grpc
    from google.rpc import error_details_pb2

    deadline = time.monotonic() + seconds
    totals = {"acked_spans": 0, "requests": 0, "pushback": 0, "errors": 0}
    lock = threading.Lock()

    def loop() -> None:
        request = _template(batch)
        with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
            export = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            body = _fresh_ids(request)
            while time.monotonic() < deadline:
                try:
                    export(body, timeout=10)
                    with lock:
                        totals["acked_spans"] += batch
                        totals["requests"] += 1
                    body = _fresh_ids(request)
                except grpc.RpcError as exc:
                    delay = 1.0
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                        trailer = dict(exc.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
                        if trailer:
                            delay = error_details_pb2.RetryInfo.FromString(trailer).retry_delay.ToTimedelta().total_seconds()
                        with lock:
                            totals["pushback"] += 1
                    else:
                        with lock:
                            totals["errors"] += 1
                    time.sleep(min(delay, max(0.0, deadline - time.monotonic())))

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    results.put(totals)


# --- measurement -----------------------------------------------------------------------------

def floor_spans_per_s(batch: int, spans: int = 40_000) -> float:
    """The floor `bench/ingest_files.py` measures, on this bench's requests: parse each one and read every span's
    attributes, nothing else, in one process (issue 43's target: serve commits >= 20% of it under the load)."""
    from ingest_files import read_floor  # the same work as the file bench's floor (bench/ is this script's path)

    template = _template(batch)
    bodies = [_fresh_ids(template) for _ in range(max(1, spans // batch))]
    start = time.perf_counter()
    read = read_floor(bodies)
    return read / (time.perf_counter() - start)


def _tree_rss_mib(pid: int) -> float:
    """RSS of a process and its descendants, with the parts its shard workers left for it in memory (`/dev/shm`)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += spooled_bytes(p) // 1024
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / 1024


def _tree_cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process and its descendants so far."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_load(name: str, address: str, pid: int, committed: Callable[[], int], args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(address, args.duration, args.batch, args.threads, results)) for _ in range(args.procs)]
    start = time.monotonic()
    for p in procs:
        p.start()
    peak, marks = 0.0, {}
    while time.monotonic() - start < args.duration:
        peak = max(peak, _tree_rss_mib(pid))
        elapsed = time.monotonic() - start
        if "warm" not in marks and elapsed >= args.warmup:
            marks["warm"] = (elapsed, committed())
            marks["cpu"] = _tree_cpu_s(pid)
        time.sleep(0.25)
    end = (time.monotonic() - start, committed())
    cpu = _tree_cpu_s(pid) - marks.get("cpu", 0.0)
    totals = {"acked_spans": 0, "requests": 0, "pushback": 0, "errors": 0}
    for _ in procs:
        for key, value in results.get(timeout=60).items():
            totals[key] += value
    for p in procs:
        p.join(30)
    (t0, c0), (t1, c1) = marks.get("warm", (0.0, 0)), end
    rate = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
    cores = cpu / (t1 - t0) if t1 > t0 else 0.0
    out = {"server": name, "committed_spans_per_s": round(rate), "committed_in_run": c1, "peak_rss_mib": round(peak, 1),
           "server_cpu_cores": round(cores, 2), **totals}
    print(f"  {name}: {out['committed_spans_per_s']:,} spans/s committed (after {args.warmup:.0f}s warm-up), "
          f"{totals['acked_spans']:,} acknowledged, {totals['pushback']:,} pushbacks, {totals['errors']} errors, "
          f"peak RSS {peak:.0f} MiB, server CPU {cores:.2f} cores", flush=True)
    return out


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} not up after {timeout}s")


def bench_plumbline(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    grpc_port, http_port = free_port(), free_port()
    log = open(workdir / "plumbline.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "plumbline_otel.cli.serve", "--db", str(workdir / "bench.duckdb"),
                             "--grpc-port", str(grpc_port), "--http-port", str(http_port), *args.serve_arg], stdout=log, stderr=log)
    _wait_http(f"http://127.0.0.1:{http_port}/healthz", 60, proc)

    def committed() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("plumbline_spans_stored_total "):
                    return int(float(line.split()[1]))
        return 0

    result = run_load("plumbline", f"127.0.0.1:{grpc_port}", proc.pid, committed, args)
    stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    result["exit_code"] = proc.wait(300)
    result["shutdown_s"] = round(time.monotonic() - stop, 1)  # drain + final assembly of everything stored
    import duckdb

    with duckdb.connect(str(workdir / "bench.duckdb"), read_only=True) as db:
        result["rows_after_stop"] = db.execute("SELECT count(*) FROM spans").fetchone()[0]
        result["trajectories_after_stop"] = db.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    return result


def bench_phoenix(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    grpc_port, http_port = free_port(), free_port()
    phoenix_dir = workdir / "phoenix"
    phoenix_dir.mkdir()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(phoenix_dir), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(http_port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = open(workdir / "phoenix.log", "wb")
    proc = subprocess.Popen([args.phoenix_python, "-c", _PHOENIX_WRAPPER], env=env, stdout=log, stderr=log)
    try:
        _wait_http(f"http://127.0.0.1:{http_port}/healthz", 180, proc)
        db_path = phoenix_dir / "phoenix.db"

        def committed() -> int:
            with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30) as db:
                return int(db.execute("SELECT count(*) FROM spans").fetchone()[0])

        result = run_load("phoenix", f"127.0.0.1:{grpc_port}", proc.pid, committed, args)
        before, waited = committed(), time.monotonic()
        last_change = waited
        while time.monotonic() - waited < 180 and time.monotonic() - last_change < 10:  # let its queue drain
            time.sleep(1)
            now = committed()
            if now != before:
                before, last_change = now, time.monotonic()
        drain = last_change - waited
        result["rows_after_drain"] = before
        result["drain_s"] = round(drain, 1)
        result["drain_spans_per_s"] = round((before - result["committed_in_run"]) / drain) if drain > 0 else 0
        print(f"  phoenix after the load: {before:,} spans stored of {result['acked_spans']:,} acknowledged, "
              f"{result['drain_spans_per_s']:,} spans/s while draining with no load", flush=True)
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per server")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds excluded from the rate")
    parser.add_argument("--procs", type=int, default=4, help="exporter processes")
    parser.add_argument("--threads", type=int, default=2, help="concurrent requests per exporter process")
    parser.add_argument("--batch", type=int, default=512, help="spans per request (the SDK's default batch)")
    parser.add_argument("--phoenix-python", default="/tmp/phoenix-venv/bin/python", help="python of a venv with arize-phoenix")
    parser.add_argument("--no-phoenix", action="store_true")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra flag for plumbline serve (repeatable)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "ingest_otlp.json"))
    args = parser.parse_args()
    size = len(_fresh_ids(_template(args.batch))) / args.batch
    print(f"load: {args.procs} processes x {args.threads} streams, {args.batch} spans/request, {size:.0f} B/span, "
          f"{args.duration:.0f}s per server, {os.cpu_count()} cores; hot path: {_native.BUILD}", flush=True)
    results: dict[str, Any] = {"bytes_per_span": round(size), "args": vars(args)}
    floor = results["floor_spans_per_s"] = round(floor_spans_per_s(args.batch))
    print(f"  floor (protobuf decode reading every attribute, one process, before the load): {floor:,} spans/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="plumbline-bench-") as tmp:
        results["plumbline"] = bench_plumbline(args, Path(tmp))
        share = results["plumbline"]["committed_spans_per_s"] / floor
        results["plumbline"]["share_of_floor"] = round(share, 4)
        print(f"  plumbline committed {share:.1%} of the floor (target >= 20%)", flush=True)
        if not args.no_phoenix and Path(args.phoenix_python).exists():
            results["phoenix"] = bench_phoenix(args, Path(tmp))
            ratio = results["plumbline"]["committed_spans_per_s"] / max(1, results["phoenix"]["committed_spans_per_s"])
            results["ratio"] = round(ratio, 1)
            print(f"  ratio plumbline/phoenix (committed spans/s): {ratio:.1f}x", flush=True)
        elif not args.no_phoenix:
            print(f"  phoenix: skipped ({args.phoenix_python} not found; see the module docstring)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
