"""The lake (plumbline_otel/lake.py) against Postgres alone, on N local instances' stores.

    python bench/lake_commit.py --instances 3 --runs 2000 [--pg postgresql://…] [--out bench/out/lake_commit.json]

Each instance's store holds `--runs` runs (3 tool calls each). Measured, for the lake (embedded SQLite
catalog, data files on local disk, and a Postgres catalog with --pg):
  * the first sync of every instance, run at once (N processes), and each one's retries;
  * an idle sync (nothing changed: the diff alone) and a small sync (10 runs rebuilt by a late span);
  * reading every run back in order (`trajectories --lake`) and the coverage report;
and, with --pg, Postgres alone as the shared store: the same runs rows (doc as JSONB) copied in
by N processes at once, 10 runs replaced, and every run read back in order.
Times are wall-clock seconds, best of one (2 shared cores: read them as orders of magnitude).

    python bench/lake_commit.py --simulate 10,30,100 [--pg postgresql://…] [--seconds 60] [--interval 10] [--workers 4] [--growth 100]

simulates that many instances committing to one lake through a Postgres catalog (one started for the bench
when --pg is not given). It is a commit simulator, not 100 servers: on 2 cores 100 processes do not fit, so
--workers processes share the instances, each instance a thread of one of them with its own name and so its
own partitions, making real commits (pyiceberg, Parquet files on local disk, the catalog's row in Postgres)
through `LakeSink._commit`, the code a sync commits with. Each instance syncs at a fixed rate: every
--interval seconds from a random offset (a sync that falls behind starts at once), until --seconds have
passed. A simulated sync is what a sync of 10 changed runs commits to one table, the runs table (5 runs rebuilt
by late spans: their rows deleted and new ones appended, and 5 new runs, ~2 KB a doc), then its watermark
(the syncs table); a real sync commits up to seven tables so, plus the watermark. Reported per scale:
syncs offered and done per second; sync wall time p50/p95/max (and p95 of the syncs with and without a
refused commit); the committing thread's CPU per sync and the workers' whole CPU per sync (pyiceberg's
helper threads, and the simulator's own reading of snapshot summaries after each commit, included);
commits refused (retries) per sync; how late syncs started (the host keeping up or not); data files added
and removed per commit (from the snapshot summaries); manifests and snapshots of the table after each
commit and at the end, and its metadata file's size (largest after a commit, and at the end), snapshots expired
by the commits themselves per sync (`--snapshots-kept 0`: none, as before commits trimmed history); the load average before and after. `--growth N`
first times one instance's N syncs back to back (does a commit's cost grow with the table's history?).
Wall times on a shared 2-core host measure the host as much as the lake: read them beside the load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_store(path: Path, runs: int, shard: int) -> None:
    from plumbline_otel.spec.testing import call, run, span_records
    from plumbline_otel.store import Store

    with Store(path) as store:
        records = []
        for i in range(runs):
            t = run(call("lookup_invoice", {"id": i}, {"ok": True}), call("schedule_payment", {"amount": i}), call("post_audit_log", {}),
                    task=f"T{i % 50}", service=f"agent-{shard % 2}", start_ns=1_700_000_000_000_000_000 + (shard * runs + i) * 1000,
                    id=f"s{shard}-run-{i:06d}")
            records += span_records(t)
        store.write_spans(records)
        store.assemble()


_SYNC = ("import sys, json; from plumbline_otel.lake import Lake, LakeSink; from plumbline_otel.store import Store; "
         "s = Store(sys.argv[1], read_only=True); r = LakeSink(Lake(sys.argv[2]), sys.argv[3]).sync(s.connection); print(json.dumps(r.as_dict()))")
_PG_COPY = ("import sys, time, duckdb, psycopg; rows = duckdb.connect(sys.argv[1], read_only=True).execute("
            "'SELECT trajectory_id, trace_id, service, task_key, start_ns, doc::VARCHAR FROM trajectories').fetchall(); "
            "c = psycopg.connect(sys.argv[2]); t = time.perf_counter(); cur = c.cursor(); "
            "cm = cur.copy('COPY runs (instance, trajectory_id, trace_id, service, task_key, start_ns, doc) FROM STDIN'); "
            "cp = cm.__enter__(); [cp.write_row((sys.argv[3], *r)) for r in rows]; cm.__exit__(None, None, None); c.commit(); print(time.perf_counter() - t)")


def parallel(commands: list[list[str]], timeout: float | None = None) -> tuple[float, list[str]]:
    """Run the commands at once; with a timeout, the ones still running then are killed (never left behind) and it raises."""
    started = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}) for c in commands]
    try:
        outs = [p.communicate(timeout=None if timeout is None else max(1.0, timeout - (time.perf_counter() - started)))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    return time.perf_counter() - started, outs


def lake_figures(lake: str, dbs: list[Path]) -> dict[str, object]:
    from plumbline_otel.lake import Lake, LakeSink
    from plumbline_otel.sources import Sources
    from plumbline_otel.spec.testing import span_records
    from plumbline_otel.store import Store

    out: dict[str, object] = {}
    seconds, outs = parallel([[sys.executable, "-c", _SYNC, str(db), lake, f"i{i}"] for i, db in enumerate(dbs)])
    out["first_sync_all_instances_s"] = round(seconds, 2)
    out["first_sync_retries"] = sum(json.loads(o)["retries"] for o in outs)
    sink = LakeSink(Lake(lake), "i0")
    with Store(dbs[0], read_only=True) as store:
        t = time.perf_counter()
        sink.sync(store.connection)  # reads the lake's fingerprints (a new process would)
        out["idle_sync_first_look_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        sink.sync(store.connection)
        out["idle_sync_s"] = round(time.perf_counter() - t, 3)
    with Store(dbs[0]) as store:
        for t_ in list(store.trajectories())[:10]:
            late = span_records(t_)[-1]
            late.span_id = "e" * 16
            late.start_ns += 1
            store.write_spans([late])
        store.assemble()
        t = time.perf_counter()
        result = sink.sync(store.connection)
        out["late_span_sync_10_runs_s"] = round(time.perf_counter() - t, 3)
        assert result.groups["runs"] == 10, result.as_dict()
    t = time.perf_counter()
    n = sum(1 for _ in Sources(lake=lake).trajectories())
    out["read_all_runs_s"], out["runs"] = round(time.perf_counter() - t, 2), n
    t = time.perf_counter()
    Sources(lake=lake).coverage()
    out["coverage_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    n_files = sum(1 for _ in Sources([str(d) for d in dbs]).trajectories())
    out["federation_read_all_runs_s"] = round(time.perf_counter() - t, 2)
    assert n_files == n
    return out


def pg_figures(url: str, dbs: list[Path]) -> dict[str, object]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS runs")
        c.execute("CREATE TABLE runs (instance TEXT, trajectory_id TEXT PRIMARY KEY, trace_id TEXT, service TEXT, task_key TEXT, "
                  "start_ns BIGINT, doc JSONB)")
        c.execute("CREATE INDEX ON runs (start_ns, trajectory_id)")
        c.execute("CREATE INDEX ON runs (instance, trace_id)")
    seconds, _ = parallel([[sys.executable, "-c", _PG_COPY, str(db), url, f"i{i}"] for i, db in enumerate(dbs)])
    out: dict[str, object] = {"first_load_all_instances_s": round(seconds, 2)}
    with psycopg.connect(url) as c:
        ids = [r[0] for r in c.execute("SELECT trace_id FROM runs WHERE instance = 'i0' LIMIT 10").fetchall()]
        docs = c.execute("SELECT trajectory_id, trace_id, service, task_key, start_ns, doc::text FROM runs WHERE trace_id = ANY(%s)", [ids]).fetchall()
        t = time.perf_counter()
        with c.transaction():
            c.execute("DELETE FROM runs WHERE instance = 'i0' AND trace_id = ANY(%s)", [ids])
            c.cursor().executemany("INSERT INTO runs VALUES ('i0', %s, %s, %s, %s, %s, %s::jsonb)", docs)
        out["replace_10_runs_s"] = round(time.perf_counter() - t, 4)
        t = time.perf_counter()
        n = len(c.execute("SELECT doc::text FROM runs ORDER BY start_ns, trajectory_id").fetchall())
        out["read_all_runs_s"], out["runs"] = round(time.perf_counter() - t, 2), n
        out["table_bytes"] = c.execute("SELECT pg_total_relation_size('runs')").fetchone()[0]  # type: ignore[index]
    return out


_SIM = """
import json, os, random, resource, sys, threading, time
import pyarrow as pa
from plumbline_otel import lake as L
from plumbline_otel.lake import HOUR_NS, SCHEMAS, SYNCS, Lake, LakeSink, SyncResult
from pyiceberg.expressions import And, EqualTo, In
lake_uri, first, count, seconds, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])

def rows(instance, keys):
    now = time.time_ns()
    n = len(keys)
    cols = {f.name: pa.nulls(n, f.type) for f in SCHEMAS['runs']}
    cols.update(instance=pa.array([instance] * n), trace_id=pa.array(keys), trajectory_id=pa.array(keys),
                start_ns=pa.array([now] * n, pa.int64()), hour=pa.array([now // HOUR_NS] * n, pa.int32()),
                doc=pa.array(['x' * 2000] * n))
    return pa.table(cols).cast(SCHEMAS['runs'])

def mine(table, name, seq):
    # this instance's snapshots committed after sequence number `seq`: files added and removed, from their summaries
    added = removed = 0
    for snap in table.snapshots():
        props = snap.summary.additional_properties if snap.summary is not None else {}
        if props.get('plumbline.instance') == name and (snap.sequence_number or 0) > seq:
            added += int(props.get('added-data-files', 0))
            removed += int(props.get('deleted-data-files', 0))
    return added, removed

out = []
lock = threading.Lock()
def commit(sink, table_name, delete, data, name):
    table = sink.lake.table(table_name)
    seq = table.metadata.last_sequence_number
    result = SyncResult()
    L._RETRIES.take()
    wall, cpu = time.monotonic(), time.thread_time()
    sink._commit(table_name, delete, data, result)
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    retries = result.retries + L._RETRIES.take()
    added, removed = mine(table, name, seq)
    manifests = len(table.current_snapshot().manifests(table.io))
    path = table.metadata_location.removeprefix('file://')
    return {'table': table_name, 'wall': wall, 'cpu': cpu, 'retries': retries, 'added': added, 'removed': removed,
            'manifests': manifests, 'snapshots': len(table.snapshots()), 'expired': result.expired,
            'metadata_bytes': os.path.getsize(path) if os.path.exists(path) else 0}

def instance(i):
    lake = Lake(lake_uri)
    name = f'sim{i}'
    sink = LakeSink(lake, name)
    sink._resolved = True
    sink.instance = name
    start = time.monotonic() + random.uniform(0, interval)
    end = time.monotonic() + seconds
    n = 0
    previous = []
    while True:
        due = start + n * interval  # a fixed arrival rate: the next sync is due at its time, or at once when late
        if due >= end:
            break
        time.sleep(max(0.0, due - time.monotonic()))
        late = time.monotonic() - due
        # a sync of 10 changed runs: 5 rebuilt by late spans (the lake's rows deleted, new ones appended) and 5 new
        keys = previous[:5] + [f'{name}-{n}-{k}' for k in range(5)]
        delete = And(EqualTo('instance', name), In('trace_id', previous[:5])) if previous else None
        a = commit(sink, 'runs', delete, rows(name, keys), name)
        w = commit(sink, SYNCS, None, pa.table({'instance': [name], 'sync_ns': [time.time_ns()], 'snapshots': [json.dumps(sink._marks, sort_keys=True)], 'rows': [10],
                                                 'hour': [time.time_ns() // HOUR_NS]}).cast(L.SYNCS_SCHEMA), name)
        with lock:
            out.append({'late': late, 'runs': a, 'watermark': w})
        previous, n = keys[-5:], n + 1

failed = []
threading.excepthook = lambda args: failed.append(args) or sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
threads = [threading.Thread(target=instance, args=(i,)) for i in range(first, first + count)]
[t.start() for t in threads]
[t.join() for t in threads]
if failed:
    sys.exit(1)  # an instance that failed is not a measurement
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({'syncs': out, 'process_cpu_s': usage.ru_utime + usage.ru_stime}))
"""


def start_postgres(root: Path) -> tuple[str, list[str]]:
    """A throwaway Postgres (as tests/lake/conftest.py starts one): its URL and the command that stops it."""
    import glob
    import shutil
    import socket

    found = shutil.which("pg_ctl") or sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
    binaries = Path(found).resolve().parent
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(root / "pg"), "-U", "postgres", "--auth=trust"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(root / "pg"), "-o", f"-h 127.0.0.1 -p {port} -k {root} -c max_connections=300",
                    "-l", str(root / "pg.log"), "-w", "start"], check=True, stdout=subprocess.DEVNULL)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", [*as_user, str(binaries / "pg_ctl"), "-D", str(root / "pg"), "-m", "fast", "stop"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3) if ordered else 0.0


def _load() -> str:
    """The load averages (1, 5, 15 min) of this shared machine."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"


def _table_state(lake: str, name: str) -> dict[str, object]:
    from plumbline_otel.lake import Lake

    table = Lake(lake).table(name)
    current = table.current_snapshot()
    path = table.metadata_location.removeprefix("file://")
    return {"snapshots": len(table.snapshots()), "manifests": len(current.manifests(table.io)) if current else 0,
            "data_files": int(table.inspect.files().num_rows) if current else 0,
            "metadata_json_bytes": os.path.getsize(path) if os.path.exists(path) else None}


def _figures(syncs: list[dict[str, Any]], process_cpu: float, n: int, seconds: float, interval: float) -> dict[str, object]:
    runs = [s["runs"] for s in syncs]
    marks = [s["watermark"] for s in syncs]
    wall = [r["wall"] + w["wall"] for r, w in zip(runs, marks)]
    retries = [r["retries"] + w["retries"] for r, w in zip(runs, marks)]
    calm = [t for t, k in zip(wall, retries) if k == 0]
    refused = [t for t, k in zip(wall, retries) if k > 0]
    return {
        "instances": n, "syncs": len(syncs), "offered_syncs_per_s": round(n / interval, 2), "done_syncs_per_s": round(len(syncs) / seconds, 2),
        "sync_wall_p50_s": _pct(wall, 0.5), "sync_wall_p95_s": _pct(wall, 0.95), "sync_wall_max_s": _pct(wall, 1.0),
        "runs_commit_wall_p50_s": _pct([r["wall"] for r in runs], 0.5), "runs_commit_wall_p95_s": _pct([r["wall"] for r in runs], 0.95),
        "watermark_commit_wall_p50_s": _pct([w["wall"] for w in marks], 0.5),
        "sync_thread_cpu_p50_s": _pct([r["cpu"] + w["cpu"] for r, w in zip(runs, marks)], 0.5),
        "sync_thread_cpu_p95_s": _pct([r["cpu"] + w["cpu"] for r, w in zip(runs, marks)], 0.95),
        "process_cpu_per_sync_s": round(process_cpu / max(1, len(syncs)), 3),
        "retries_per_sync": round(sum(retries) / max(1, len(syncs)), 2), "syncs_retried_share": round(len(refused) / max(1, len(syncs)), 3),
        "retries_max": max(retries, default=0),
        "wall_p95_of_syncs_without_retry_s": _pct(calm, 0.95), "wall_p95_of_syncs_with_retry_s": _pct(refused, 0.95),
        "start_late_p95_s": _pct([s["late"] for s in syncs], 0.95),
        "runs_files_added_mean": round(sum(r["added"] for r in runs) / max(1, len(runs)), 2),
        "runs_files_removed_mean": round(sum(r["removed"] for r in runs) / max(1, len(runs)), 2),
        "runs_files_removed_max": max((r["removed"] for r in runs), default=0),
        "runs_manifests_max": max((r["manifests"] for r in runs), default=0),
        "runs_snapshots_max": max((r["snapshots"] for r in runs), default=0),
        "runs_metadata_bytes_max": max((r["metadata_bytes"] for r in runs), default=0),
        "snapshots_expired_per_sync": round(sum(r["expired"] + w["expired"] for r, w in zip(runs, marks)) / max(1, len(syncs)), 2),
    }


def simulate(url: str, scales: list[int], seconds: float, interval: float, tmp: Path, workers: int) -> dict[str, object]:
    import psycopg

    out: dict[str, object] = {}
    for n in scales:
        db = f"sim{n}"
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
            c.execute(f"CREATE DATABASE {db}")
        lake = f"{url.rsplit('/', 1)[0]}/{db}?warehouse={tmp / ('w' + str(n))}"
        from plumbline_otel.lake import SYNCS, Lake

        Lake(lake).table("runs"), Lake(lake).table(SYNCS)
        share = [n // workers + (1 if w < n % workers else 0) for w in range(workers)]
        commands, first = [], 0
        for count in share:
            if count:
                commands.append([sys.executable, "-c", _SIM, lake, str(first), str(count), str(seconds), str(interval)])
            first += count
        load_before = _load()
        _, outs = parallel(commands, timeout=6 * seconds + 300)
        parsed = [json.loads(o) for o in outs]
        syncs = [x for p in parsed for x in p["syncs"]]
        figures = _figures(syncs, sum(p["process_cpu_s"] for p in parsed), n, seconds, interval)
        figures["runs_table_at_end"] = _table_state(lake, "runs")
        figures["syncs_table_at_end"] = _table_state(lake, SYNCS)
        figures["load_before"], figures["load_after"] = load_before, _load()
        out[f"{n}_instances"] = figures
        print(n, json.dumps(figures), flush=True)
    return out


def growth(url: str, tmp: Path, commits: int) -> dict[str, object]:
    """One instance committing a sync of 10 changed runs back to back, `commits` times: do its last cost more than its first?"""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS growth")
        c.execute("CREATE DATABASE growth")
    lake = f"{url.rsplit('/', 1)[0]}/growth?warehouse={tmp / 'g'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # interval 0.001 s: back to back; `seconds` large enough for `commits` of them is cut by the count below
    result = subprocess.run([sys.executable, "-c", _SIM.replace("if due >= end:", f"if n >= {commits}:"), lake, "0", "1", "1e9", "0.001"],
                            check=True, env=env, capture_output=True, text=True)
    syncs = json.loads(result.stdout)["syncs"]
    first, last = syncs[:10], syncs[-10:]

    def cpu(part: list[dict[str, Any]]) -> float:
        return _pct([s["runs"]["cpu"] + s["watermark"]["cpu"] for s in part], 0.5)

    def wall(part: list[dict[str, Any]]) -> float:
        return _pct([s["runs"]["wall"] + s["watermark"]["wall"] for s in part], 0.5)

    return {"commits": len(syncs), "first_10_sync_cpu_p50_s": cpu(first), "last_10_sync_cpu_p50_s": cpu(last),
            "first_10_sync_wall_p50_s": wall(first), "last_10_sync_wall_p50_s": wall(last),
            "manifests_after_each_10th": [s["runs"]["manifests"] for s in syncs[9::10]],
            "snapshots_after_each_10th": [s["runs"]["snapshots"] for s in syncs[9::10]],
            "metadata_bytes_after_each_10th": [s["runs"]["metadata_bytes"] for s in syncs[9::10]],
            "files_removed_per_commit_max": max(s["runs"]["removed"] for s in syncs),
            "runs_table_at_end": _table_state(lake, "runs")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--pg", default=None, help="a Postgres database: its catalog for the lake, and Postgres alone")
    parser.add_argument("--out", default=None)
    parser.add_argument("--simulate", default=None, help="instance counts to simulate, e.g. 10,30,100")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4, help="processes the simulated instances share (each instance a thread)")
    parser.add_argument("--growth", type=int, default=100, help="one instance's back-to-back syncs, to see whether cost grows (0: none)")
    parser.add_argument("--snapshots-kept", type=int, default=None,
                        help="PLUMBLINE_LAKE_SNAPSHOTS for the simulated instances (0: commits expire nothing, as before)")
    args = parser.parse_args()
    if args.snapshots_kept is not None:
        os.environ["PLUMBLINE_LAKE_SNAPSHOTS"] = str(args.snapshots_kept)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a killed bench still stops the Postgres it started
    tmp = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    if args.simulate:
        stop: list[str] = []
        url = args.pg
        if url is None:
            pgroot = Path(tempfile.mkdtemp(prefix="lake-bench-pg-"))
            pgroot.chmod(0o755)
            url, stop = start_postgres(pgroot)
        try:
            sim: dict[str, object] = {"machine": {"cores": os.cpu_count(), "load_at_start": _load()}, "seconds": args.seconds,
                                      "interval_s": args.interval, "workers": args.workers}
            if args.growth:
                sim["one_instance_back_to_back"] = growth(url, tmp, args.growth)
                print(json.dumps(sim["one_instance_back_to_back"]), flush=True)
            sim["simulate"] = simulate(url, [int(n) for n in args.simulate.split(",")], args.seconds, args.interval, tmp, args.workers)
        finally:
            if stop:
                subprocess.run(stop, check=False, stdout=subprocess.DEVNULL)
        text = json.dumps(sim, indent=2)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return
    dbs = [tmp / f"i{i}.duckdb" for i in range(args.instances)]
    for i, db in enumerate(dbs):
        make_store(db, args.runs, i)
    figures: dict[str, object] = {"instances": args.instances, "runs_per_instance": args.runs}
    figures["lake_sqlite_catalog"] = lake_figures(str(tmp / "lake"), [Path(str(d)) for d in dbs])
    for i, db in enumerate(dbs):  # fresh copies: the late spans above changed the first store
        make_store(db.with_suffix(".b.duckdb"), args.runs, i)
    fresh = [db.with_suffix(".b.duckdb") for db in dbs]
    if args.pg:
        figures["lake_postgres_catalog"] = lake_figures(f"{args.pg}?warehouse={tmp / 'pg-warehouse'}", fresh)
        figures["postgres_alone"] = pg_figures(args.pg, fresh)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
