"""File ingest benchmark: spans/s from OTLP files to committed rows and trajectories, with CPU and peak memory.

    .venv/bin/python bench/ingest_files.py [--spans 200000] [--long-trace 20000]

Builds a file of realistic agent spans (tests/corpus.py: half OTel GenAI, half OpenInference,
~1 KB each with JSON arguments and results), as OTLP JSON lines and as a length-prefixed protobuf
stream (the Collector file exporter's two formats), then ingests each in a fresh process into a
fresh DuckDB file: with the shard workers (one per core) and in one process (the same code, its
stages timed in CPU time of the thread that ran them). Printed beside them, from the same run: the floor, a bare protobuf decode that reads
every span's attributes; the JSON peer, `google.protobuf.json_format`; whether both ways stored
identical trajectories; and one trace of `--long-trace` spans, for its peak memory. Peak memory is the
process tree's: the writer and its workers (with multiprocessing, its resource tracker), summed at one moment.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel import _native

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

def write_files(total: int, directory: Path, name: str = "spans", per_request: int = 1000) -> tuple[Path, Path, int]:
    from corpus import build_requests
    from otlp import to_otlp_json  # the spec's OTLP JSON, the same encoding the tests use

    jsonl, proto = directory / f"{name}.otlp.jsonl", directory / f"{name}.otlp.pb"
    size = 0
    with open(jsonl, "w") as j, open(proto, "wb") as p:
        for request in build_requests(total, per_request):
            body = request.SerializeToString()
            size += len(body)
            p.write(len(body).to_bytes(4, "big") + body)
            j.write(json.dumps(to_otlp_json(request)) + "\n")
    return jsonl, proto, size


class _Nesting(threading.local):
    """Per thread (one process writes on a thread of its own), per running timed call, the time of the timed calls inside it."""

    def __init__(self) -> None:
        self.calls: list[float] = []


_NESTING = _Nesting()
_DONE = object()  # what `_timed_iter` gets from `next` when its generator is exhausted


def _timed(owner: object, name: str, bucket: str, t: dict[str, float]) -> None:
    """Wrap `owner.name` so the real ingest path records the CPU time its thread spent in it, less that of
    timed calls inside it (a trajectory table assembles its runs as it consumes them). CPU, not wall
    time: the writer runs on its own thread beside the shard, and on a shared machine a stage's wall
    time is mostly other people's work (DuckDB's own threads are in the process's CPU, not in `write`)."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        start, nested = time.thread_time(), _NESTING.calls
        nested.append(0.0)
        try:
            return inner(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            t[bucket] += spent - nested.pop()
            if nested:
                nested[-1] += spent

    setattr(owner, name, wrapper)


def _timed_iter(owner: object, name: str, bucket: str, t: dict[str, float]) -> None:
    """`_timed` for a generator function: each item is timed as it is produced, inside whatever
    timed call consumes it. (Calls between compiled modules never pass through a module attribute,
    so assembly is timed where the pipeline asks for a trace's runs, not per run.)"""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        items = inner(*args, **kwargs)
        while True:
            start, nested = time.thread_time(), _NESTING.calls
            nested.append(0.0)
            try:
                item = next(items, _DONE)
            finally:
                spent = time.thread_time() - start
                t[bucket] += spent - nested.pop()
                if nested:
                    nested[-1] += spent
            if item is _DONE:
                return
            yield item

    setattr(owner, name, wrapper)


_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


class _Peaks:
    """Peak memory of this process and its children (the shard workers), sampled every 25 ms.

    The tree's peak is the sum of every process's RSS at one moment (the writer and each worker, the
    ones the first worker forked included) and of the parts the workers left in memory for the writer
    (`pipeline.spooled_bytes`), as `bench/ingest_otlp.py` measures a server. Sampling is
    kept cheap, because it runs in the process it measures: each tick reads one `statm` per
    process, and the children are looked up every 8th tick (reading every thread's `children` and
    `status` each tick took 4% of a core).

    Not `RUSAGE_CHILDREN` for the workers: a launched worker starts as a fork of this process, so its
    `ru_maxrss` is at least this process's size at that moment, before it runs a line of its own. A
    child still showing this process's command line is that fork (its pages are this process's) and
    is skipped until it has become the worker.
    """

    def __init__(self) -> None:

        self.peaks: dict[int, int] = {}
        self.tree_kib = 0
        self.once_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _resident_kib(pid: int | str) -> tuple[int, int]:
        """(resident, of it the pages mapped from files: libraries, mostly the same in every process of the tree)."""
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        return int(fields[1]) * _PAGE_KIB, int(fields[2]) * _PAGE_KIB

    def _children(self, me: int, own_command: bytes) -> list[int]:
        """Every process below this one (the first shard worker forks the others: they are its children, not ours)."""
        found, todo = [], [me]
        while todo:
            parent = todo.pop()
            try:
                tasks = os.listdir(f"/proc/{parent}/task")
            except OSError:  # the process ended
                continue
            for tid in tasks:
                try:
                    children = open(f"/proc/{parent}/task/{tid}/children").read().split()
                except OSError:  # the thread ended
                    continue
                for pid in children:
                    try:
                        if open(f"/proc/{pid}/cmdline", "rb").read() != own_command:
                            found.append(int(pid))
                            todo.append(int(pid))
                    except OSError:  # the child ended
                        continue
        return found

    def _run(self) -> None:
        from plumbline_otel.pipeline import spooled_bytes

        me = os.getpid()
        own_command = open(f"/proc/{me}/cmdline", "rb").read()
        children: list[int] = []
        tick = 0
        while not self._stop.wait(0.025):
            if tick % 8 == 0:
                children = self._children(me, own_command)
            tick += 1
            total = self._resident_kib(me)[0] + spooled_bytes(me) // 1024
            once = total  # the same, each child's library pages counted once (in the writer, which maps them too)
            for pid in children:
                try:
                    kib, files = self._resident_kib(pid)
                except OSError:  # the worker ended
                    continue
                total += kib
                once += kib - files
                self.peaks[pid] = max(self.peaks.get(pid, 0), kib)
            self.tree_kib = max(self.tree_kib, total)
            self.once_kib = max(self.once_kib, once)

    def stop(self) -> tuple[float, float, float]:
        """(the tree's sampled peak, the same with the children's file-backed pages left out, the largest worker's sampled peak), in MiB.

        The second is beside the first, not the target's measure: a worker's resident pages include ~38 MiB
        of libraries (Python's, pyarrow's, protobuf's) that the writer maps too, which the sum of RSS
        counts once per process."""
        self._stop.set()
        self._thread.join()
        return self.tree_kib / 1024, self.once_kib / 1024, max(self.peaks.values(), default=0) / 1024


def run_ingest(path: str, workers: int | None) -> dict[str, float]:
    """`ingest_files` on one file (in its own process); stages timed when `workers` is 0 (in one process).

    `workers` None is what `plumbline ingest` chooses (`pipeline.default_workers`), reported as `workers`.
    """
    import hashlib

    from plumbline_otel import ingest, pipeline
    from plumbline_otel.pipeline import _shard  # the stage functions a shard calls, timed where it calls them
    from plumbline_otel.store import Store

    t = {"decode": 0.0, "normalise": 0.0, "tables": 0.0, "write": 0.0, "assemble": 0.0}
    if workers == 0:
        _timed(_shard, "decode_unit", "decode", t)
        _timed(_shard, "normalise_request", "normalise", t)
        _timed(_shard, "span_table", "tables", t)
        _timed(_shard, "trajectory_table", "tables", t)
        _timed_iter(_shard, "iter_runs", "assemble", t)  # a trace's runs, assembled as the tables consume them
        _timed(Store, "write_span_table", "write", t)
        _timed(Store, "write_assembled", "write", t)
    pipeline.collect_less_often()  # as `plumbline ingest` does for its own process
    db = Path(path).with_suffix(f".w{workers}.duckdb")
    db.unlink(missing_ok=True)
    peaks = _Peaks()
    start = time.perf_counter()
    with Store(db) as store:
        summary = ingest.ingest_files(store, [path], workers=workers)
    t["total"] = time.perf_counter() - start  # end to end: the file closed, its write-ahead log checkpointed
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)  # before the check below
    tree, once, t["peak_worker_mb"] = peaks.stop()
    digest = hashlib.sha256()
    with Store(db, read_only=True) as store:
        for (doc,) in store.connection.execute("SELECT doc FROM trajectories ORDER BY trajectory_id").fetchall():
            digest.update(doc.encode())
    t["spans"] = summary.stored
    t["trajectories"] = summary.trajectories
    t["digest"] = digest.hexdigest()  # type: ignore[assignment]
    t["workers"] = summary.workers  # what `plumbline ingest` chose, when `workers` is None
    t["cpu_main"] = me.ru_utime + me.ru_stime
    t["cpu_workers"] = children.ru_utime + children.ru_stime
    t["peak_main_mb"] = me.ru_maxrss / 1024
    t["peak_rss_mb"] = max(tree, t["peak_main_mb"])  # the process tree at its peak (never below the writer's own)
    t["peak_once_mb"] = max(once, t["peak_main_mb"])  # the same, libraries counted once
    db.unlink(missing_ok=True)
    return t


def read_floor(bodies: Iterable[bytes]) -> int:
    """The floor's work on protobuf request bodies: parse each and read every span's attributes, nothing else; the spans read."""
    spans = 0
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    for kv in span.attributes:
                        kv.value.string_value  # noqa: B018 - the read is the work
                    spans += 1
    return spans


def run_floor(path: str) -> dict[str, float]:
    """The floor on a file's requests (`read_floor`)."""
    from plumbline_otel.decode import iter_units

    start = time.perf_counter()
    spans = read_floor(unit.data for unit in iter_units(Path(path)))
    return {"spans": spans, "total": time.perf_counter() - start}


def run_peer(path: str, limit: int) -> dict[str, float]:
    """Peer: google.protobuf.json_format on the same OTLP JSON lines (decode only, hex ids pre-fixed)."""
    import base64

    from google.protobuf.json_format import ParseDict

    def fix(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") and v else fix(v)) for k, v in node.items()}
        return [fix(v) for v in node] if isinstance(node, list) else node

    spans, start = 0, time.perf_counter()
    with open(path) as f:
        for line in f:
            request = ParseDict(fix(json.loads(line)), ExportTraceServiceRequest())
            spans += sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
            if spans >= limit:
                break
    return {"spans": spans, "total": time.perf_counter() - start}


def run_json_decode(path: str, limit: int) -> dict[str, float]:
    """OTLP JSON decode alone: `decode_unit` on the file's JSON lines, every span mapped (no shard filter), as the
    one-process ingest decodes them; CPU time of this thread, nothing normalised or stored."""
    from plumbline_otel.decode import decode_unit, iter_units

    spans, cpu = 0, 0.0
    for unit in iter_units(Path(path)):
        start = time.thread_time()
        request = decode_unit(unit).request
        cpu += time.thread_time() - start
        spans += sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
        if spans >= limit:
            break
    return {"spans": spans, "cpu": cpu}


def _child(mode: str, path: str, arg: int | str = 0) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, path, str(arg)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _long_trace(total: int, directory: Path) -> Path:
    """One trace of `total` spans (a long-running agent), in requests of 500 spans."""
    from corpus import build_requests

    path = directory / "long.otlp.pb"
    with open(path, "wb") as out:
        for request in build_requests(total, 500):
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        span.trace_id = (7).to_bytes(16, "big")
            body = request.SerializeToString()
            out.write(len(body).to_bytes(4, "big") + body)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--long-trace", type=int, default=20_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, path, arg = args.child
        result = {"ingest": lambda: run_ingest(path, None if arg == "default" else int(arg)), "floor": lambda: run_floor(path),
                  "peer": lambda: run_peer(path, int(arg)), "json_decode": lambda: run_json_decode(path, int(arg))}[mode]()
        print(json.dumps(result))
        return
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, proto, size = write_files(args.spans, Path(tmp))
        print(f"{args.spans} spans, {size / args.spans:.0f} B/span protobuf, JSON {os.path.getsize(jsonl) / 1e6:.0f} MB, {cores} cores")
        print(f"hot path (plumbline_otel/_native.py): {_native.BUILD}")
        floor = _child("floor", str(proto))
        floor_rate = floor["spans"] / floor["total"]
        print(f"floor (protobuf decode reading every attribute): {floor_rate:,.0f} spans/s\n")
        print(f"{'input':9} {'workers':>7} {'spans/s':>9} {'total s':>8} {'CPU main':>9} {'CPU workers':>12} {'peak RSS':>9}  per-span CPU µs (one process): decode normalise tables write assemble")
        results = {}
        for label, path in (("protobuf", proto), ("json", jsonl)):
            for workers in (cores, 0):
                r = results[(label, workers)] = _child("ingest", str(path), workers)
                stages = ""
                if workers == 0:
                    stages = "  " + " ".join(f"{r[k] / r['spans'] * 1e6:.0f}" for k in ("decode", "normalise", "tables", "write", "assemble"))
                print(f"{label:9} {workers:7} {r['spans'] / r['total']:9,.0f} {r['total']:8.2f} {r['cpu_main']:8.1f}s {r['cpu_workers']:11.1f}s {r['peak_rss_mb']:6.0f}MiB{stages}")
        peer = _child("peer", str(jsonl), min(args.spans, 20_000))
        best = {label: results[(label, cores)]["spans"] / results[(label, cores)]["total"] for label in ("protobuf", "json")}
        same = all(results[(label, cores)]["digest"] == results[(label, 0)]["digest"] for label in ("protobuf", "json"))
        print(f"\nidentical trajectories with {cores} workers and in one process: {'yes' if same else 'NO'}")
        print(f"protobuf: {best['protobuf']:,.0f} spans/s = {best['protobuf'] / floor_rate:.1%} of the floor (issue 43's target: 25%)")
        print(f"json:     {best['json']:,.0f} spans/s; JSON decode peer json_format {peer['spans'] / peer['total']:,.0f} spans/s "
              f"(on {peer['spans']} spans): ratio {best['json'] / (peer['spans'] / peer['total']):.1f}x end to end (issue 43's target: 10x)")
        # JSON decode alone, beside the peer's decode on the same spans (the peer is wall time in a child of its own)
        decode = _child("json_decode", str(jsonl), min(args.spans, 20_000))
        peer_us = peer["total"] / peer["spans"] * 1e6
        print(f"JSON decode alone (decode_unit, every span mapped, CPU): {decode['cpu'] / decode['spans'] * 1e6:.1f} µs/span; "
              f"json_format {peer_us:.1f} µs/span (wall): {peer_us / (decode['cpu'] / decode['spans'] * 1e6):.1f}x")
        if args.long_trace:
            path = str(_long_trace(args.long_trace, Path(tmp)))
            print(f"one trace of {args.long_trace} spans (target: peak RSS < 300 MiB):")
            for workers in ("default", cores, 0):  # what `plumbline ingest` chooses, then each mode forced
                long = _child("ingest", path, workers)
                how = f"default ({long['workers']:.0f} workers)" if workers == "default" else f"{workers} workers"
                print(f"  {how}: {long['spans'] / long['total']:,.0f} spans/s, {long['trajectories']:.0f} trajectories, "
                      f"peak RSS {long['peak_rss_mb']:.0f} MiB for the process tree; own peaks: writer {long['peak_main_mb']:.0f} MiB"
                      + (f", largest worker {long['peak_worker_mb']:.0f} MiB; the tree with the workers' library pages "
                         f"counted once (in the writer) {long['peak_once_mb']:.0f} MiB" if long["workers"] else ""))


if __name__ == "__main__":
    main()
