"""A shared replay study (Postgres state) under faults, issue 39 items 7-9: a runner that joins never interrupts a live
runner's attempts; a runner paused past its lease is fenced (its late result is a shown duplicate, never the trial's result,
and the account counts its spend once); a Postgres restart under running runners is ridden out, nothing runs twice.

Each runner is `tests/lake/study_runner.py` in a process of its own, its agent held at a gate the test opens; waits are on
events (files, rows, process exits) with generous deadlines, never on the machine's speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap, StudyClaims, shared_keys
from plumbline_otel.store import Store
from plumbline_otel.trials import account

from .conftest import PG_CTL_WAIT_S, _free_port, _pg_bin

ROOT = Path(__file__).resolve().parents[2]
RUNNER = str(Path(__file__).with_name("study_runner.py"))


def _until(what: str, ready: Callable[[], bool], timeout: float = EVENT_DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start(url: str, tmp: Path, name: str, trials: int, lease: str = "30", opened: bool = False) -> tuple[subprocess.Popen[str], Path]:
    gate = tmp / f"gate-{name}"
    gate.mkdir()
    if opened:
        (gate / "open").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "PLUMBLINE_STUDY_LEASE_S": lease, "PLUMBLINE_PG_RECONNECT_S": "120"}
    proc = subprocess.Popen([sys.executable, RUNNER, url, str(tmp / f"state-{name}"), str(tmp / f"spans-{name}.jsonl"), str(gate),
                             str(trials)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, gate


def _started(gate: Path) -> int:
    return len(list(gate.glob("started-*")))


def _finish(proc: subprocess.Popen[str]) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _certified(url: str, tmp: Path) -> list:
    with Store(tmp / "c.duckdb") as store:
        ingest_files(store, [str(p) for p in sorted(tmp.glob("spans-*.jsonl"))])
        return account(store.trajectories(), shared_keys(url)).results


def _outcomes(url: str) -> list[dict]:
    return [r for r in PgLedger(url, "faults").rows if r.get("trial_id") and r.get("status") not in (None, "started")]


def test_a_runner_that_joins_leaves_the_live_runner_s_attempts_alone(postgres_db: str, tmp_path: Path) -> None:
    """Item 7: runner A has two attempts in flight; B joins the study, runs the other two, and interrupts nothing."""
    a, gate_a = _start(postgres_db, tmp_path, "a", 4)
    _until("runner A's two attempts to start", lambda: _started(gate_a) == 2)
    b, _ = _start(postgres_db, tmp_path, "b", 4, opened=True)
    joined, _ = _finish(b)
    (gate_a / "open").touch()
    first, _ = _finish(a)
    assert joined["recovered"] == [] and first["recovered"] == []
    assert not [r for r in _outcomes(postgres_db) if str(r.get("reason") or "").startswith("interrupted")]
    ok = sorted(r["trial_id"] for out in (first, joined) for r in out["records"] if r["status"] == "ok")
    assert len(ok) == len(set(ok)) == 4  # each trial ran once, by one runner or the other
    results = _certified(postgres_db, tmp_path)
    assert sorted(r.status for r in results) == ["exposed"] * 4  # every trial that ran and was paid for is counted


def test_only_an_attempt_whose_runner_s_lease_expired_counts_as_unfinished(postgres_db: str) -> None:
    """Item 7, in the ledger: what a joining runner would record as interrupted is only the lapsed runner's attempt."""
    live = StudyClaims(postgres_db, "faults", runner="live", lease_s=60)
    lapsing = StudyClaims(postgres_db, "faults", runner="lapsing", lease_s=0.5)
    ledger = PgLedger(postgres_db, "faults")
    ledger.fence = live
    ledger.begin_attempt("t-live")
    ledger.fence = lapsing
    ledger.begin_attempt("t-lapsed")
    _until("the lapsing runner's lease to expire", lambda: set(PgLedger(postgres_db, "faults").unfinished()) == {"t-lapsed"}, 30)
    assert set(PgLedger(postgres_db, "faults").unfinished()) == {"t-lapsed"}
    live.close()


def test_a_runner_paused_past_its_lease_is_fenced_and_its_duplicate_shown(postgres_db: str, tmp_path: Path) -> None:
    """Item 8: A is paused (SIGSTOP) with two attempts in flight until its lease lapses; B takes both trials over and runs
    them. A, resumed, finishes its two executions: neither is recorded as a result, both are shown as duplicates, and
    the account counts each reservation once."""
    a, gate_a = _start(postgres_db, tmp_path, "a", 2, lease="2")
    _until("runner A's two attempts to start", lambda: _started(gate_a) == 2)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        import psycopg

        def lapsed() -> bool:
            with psycopg.connect(postgres_db) as connection:
                runners = connection.execute("SELECT count(*) FROM plumbline_study_runners WHERE lease_until > now()").fetchone()
                claims = connection.execute("SELECT count(*) FROM plumbline_study_claims WHERE lease_until > now()").fetchone()
            return runners is not None and claims is not None and runners[0] == 0 and claims[0] == 0

        _until("runner A's lease to lapse", lapsed)
        b, _ = _start(postgres_db, tmp_path, "b", 2, lease="2", opened=True)
        took, _ = _finish(b)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    (gate_a / "open").touch()
    paused, _ = _finish(a)
    assert sorted(took["recovered"]) == sorted(r["trial_id"] for r in took["records"])  # A's attempts, found interrupted
    assert [r["status"] for r in took["records"]] == ["ok", "ok"]
    assert [r["status"] for r in paused["records"]] == ["duplicate", "duplicate"]
    assert "duplicate" in paused["render"] and "fenced" in paused["render"]
    decided = [r for r in _outcomes(postgres_db) if r["status"] in ("ok", "errored")]
    assert len(decided) == len({r["trial_id"] for r in decided}) == 2  # one result per trial, never A's
    # $0.10 per execution, four executions: A's two reservations released by B at $0.10 each, A's late settlements add
    # nothing more, B's two runs; before fencing A settled again ($0.60).
    assert PgSpendCap(postgres_db, "faults", 10.0).spent == pytest.approx(0.4)
    results = _certified(postgres_db, tmp_path)
    assert sorted(r.status for r in results) == ["exposed", "exposed"]
    assert all(any(n.startswith("duplicate execution") for n in r.notes) for r in results)


class _OwnPostgres:
    """A Postgres server of the test's own, which it can restart under the runners."""

    def __init__(self) -> None:
        binaries = _pg_bin()
        if binaries is None:
            pytest.skip("PostgreSQL is not installed")
        self.bin = binaries
        self.root = Path(tempfile.mkdtemp(prefix="plumbline-pg-restart-"))
        self.data = self.root / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o755)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        subprocess.run([*self.as_user, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, stdout=subprocess.DEVNULL)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
                        "-w", "-t", PG_CTL_WAIT_S, *args], check=True, stdout=subprocess.DEVNULL)


@pytest.fixture
def own_postgres() -> Iterator[_OwnPostgres]:
    server = _OwnPostgres()
    server.ctl("start")
    try:
        yield server
    finally:
        subprocess.run([*server.as_user, str(server.bin / "pg_ctl"), "-D", str(server.data), "-m", "immediate", "-w", "-t", PG_CTL_WAIT_S, "stop"],
                       check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.mark.slow
def test_runners_ride_out_a_postgres_restart_and_nothing_runs_twice(own_postgres: _OwnPostgres, tmp_path: Path) -> None:
    """Item 9: two runners with attempts in flight; Postgres is stopped (fast: their connections are cut) and, a moment
    later, started again. Both reconnect with back-off and go on; every trial runs exactly once."""
    url = own_postgres.url
    a, gate_a = _start(url, tmp_path, "a", 6, lease="6")
    _until("runner A's attempts to start", lambda: _started(gate_a) == 2)
    b, gate_b = _start(url, tmp_path, "b", 6, lease="6")
    _until("runner B's attempts to start", lambda: _started(gate_b) == 2)
    own_postgres.ctl("-m", "fast", "stop")
    (gate_a / "open").touch()  # the four attempts finish while Postgres is down: their outcomes wait for it
    (gate_b / "open").touch()
    time.sleep(1.0)  # down long enough for both runners to find it gone (their waits are on the reconnect, not on this)
    own_postgres.ctl("start")
    first, err_a = _finish(a)
    second, err_b = _finish(b)
    assert "reconnected" in err_a + err_b
    ok = [r["trial_id"] for out in (first, second) for r in out["records"] if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 6, (first, second)
    decided = [r for r in _outcomes(url) if r["status"] in ("ok", "errored")]
    assert len(decided) == len({r["trial_id"] for r in decided}) == 6
    assert PgSpendCap(url, "faults", 10.0).spent == pytest.approx(0.6)  # each run's $0.10 counted once
    assert sorted(r.status for r in _certified(url, tmp_path)) == ["exposed"] * 6
