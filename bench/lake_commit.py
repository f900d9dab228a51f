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

    python bench/lake_commit.py --simulate 10,30,100 [--pg postgresql://…] [--seconds 20] [--interval 10]

simulates that many instances committing against a Postgres catalog (one started for the bench when --pg is
not given): 4 processes, each running its share of the instances as threads; each instance commits every
--interval seconds (first commit at a random offset) what a sync of 10 changed runs commits to one table (its
rows of 10 traces deleted and 10 new appended, in its own partitions) plus its watermark. Reported per scale:
commits offered and done per second, commit latency (median, p95), retries per commit, and the estimated
sync time (eight such commits: seven tables and the watermark). `--growth N` also times one instance's
small commit after N earlier ones (does a commit's cost grow with the table and its history?).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
import json, random, sys, threading, time
import pyarrow as pa
from plumbline_otel.lake import HOUR_NS, SCHEMAS, Lake, LakeSink, SyncResult
lake_uri, first, count, seconds, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
from pyiceberg.expressions import And, EqualTo, In

def rows(instance, keys):
    now = time.time_ns()
    n = len(keys)
    cols = {f.name: pa.nulls(n, f.type) for f in SCHEMAS['runs']}
    cols.update(instance=pa.array([instance] * n), trace_id=pa.array(keys), trajectory_id=pa.array(keys),
                start_ns=pa.array([now] * n, pa.int64()), hour=pa.array([now // HOUR_NS] * n, pa.int32()),
                doc=pa.array(['x' * 2000] * n))
    return pa.table(cols).cast(SCHEMAS['runs'])

out = []
lock = threading.Lock()
def instance(i):
    lake = Lake(lake_uri)
    name = f'sim{i}'
    sink = LakeSink(lake, name)
    sink._resolved = True
    sink.instance = name
    end = time.monotonic() + seconds
    time.sleep(random.uniform(0, interval))
    n = 0
    previous = []
    while time.monotonic() < end:
        started = time.monotonic()
        keys = [f'{name}-{n}-{k}' for k in range(10)]
        result = SyncResult()
        delete = And(EqualTo('instance', name), In('trace_id', previous)) if previous else None
        sink._commit('runs', delete, rows(name, keys), result)
        sink._write_watermark(result)
        took = time.monotonic() - started
        with lock:
            out.append((took, result.retries))
        previous, n = keys[:5], n + 1
        time.sleep(max(0.0, interval - took))

threads = [threading.Thread(target=instance, args=(i,)) for i in range(first, first + count)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
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


def simulate(url: str, scales: list[int], seconds: float, interval: float, tmp: Path) -> dict[str, object]:
    import psycopg

    out: dict[str, object] = {}
    for n in scales:
        db = f"sim{n}"
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {db}")
        lake = f"{url.rsplit('/', 1)[0]}/{db}?warehouse={tmp / ('w' + str(n))}"
        from plumbline_otel.lake import SYNCS, Lake

        Lake(lake).table("runs"), Lake(lake).table(SYNCS)
        workers = 4
        share = [n // workers + (1 if w < n % workers else 0) for w in range(workers)]
        commands, first = [], 0
        for count in share:
            commands.append([sys.executable, "-c", _SIM, lake, str(first), str(count), str(seconds), str(interval)])
            first += count
        wall, outs = parallel(commands, timeout=4 * seconds + 120)
        done = [tuple(x) for o in outs for x in json.loads(o)]
        took = sorted(t for t, _ in done)
        retries = sum(r for _, r in done)
        out[f"{n}_instances"] = {
            "commits": len(done), "offered_per_s": round(n / interval, 2), "done_per_s": round(len(done) / seconds, 2),
            "commit_median_s": round(took[len(took) // 2], 3), "commit_p95_s": round(took[int(len(took) * 0.95)], 3),
            "retries_per_commit": round(retries / max(1, len(done)), 2), "est_sync_s": round(8 * took[len(took) // 2], 2)}
        print(n, out[f"{n}_instances"], flush=True)
    return out


def growth(url: str, tmp: Path, seconds: float) -> dict[str, object]:
    """One instance committing 10 changed runs back to back for `seconds`: are its last commits slower than its first?"""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE DATABASE growth")
    lake = f"{url.rsplit('/', 1)[0]}/growth?warehouse={tmp / 'g'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _SIM, lake, "0", "1", str(seconds), "0.0"], check=True, env=env, capture_output=True, text=True)
    took = [x[0] for x in json.loads(result.stdout)]
    from plumbline_otel.lake import Lake

    table = Lake(lake).table("runs")
    first, last = sorted(took[:10]), sorted(took[-10:])
    return {"commits": len(took), "snapshots": len(table.snapshots()), "manifests": len(table.current_snapshot().manifests(table.io)),
            "first_10_median_s": round(first[len(first) // 2], 3), "last_10_median_s": round(last[len(last) // 2], 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--pg", default=None, help="a Postgres database: its catalog for the lake, and Postgres alone")
    parser.add_argument("--out", default=None)
    parser.add_argument("--simulate", default=None, help="instance counts to simulate, e.g. 10,30,100")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    if args.simulate:
        stop: list[str] = []
        url = args.pg
        if url is None:
            pgroot = Path(tempfile.mkdtemp(prefix="lake-bench-pg-"))
            pgroot.chmod(0o755)
            url, stop = start_postgres(pgroot)
        try:
            figures = {"simulate": simulate(url, [int(n) for n in args.simulate.split(",")], args.seconds, args.interval, tmp),
                       "seconds": args.seconds, "interval_s": args.interval}
            figures["one_instance_back_to_back"] = growth(url, tmp, args.seconds)
        finally:
            if stop:
                subprocess.run(stop, check=False, stdout=subprocess.DEVNULL)
        text = json.dumps(figures, indent=2)
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
