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


def parallel(commands: list[list[str]]) -> tuple[float, list[str]]:
    started = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}) for c in commands]
    outs = [p.communicate()[0] for p in procs]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--pg", default=None, help="a Postgres database: its catalog for the lake, and Postgres alone")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lake-bench-"))
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
