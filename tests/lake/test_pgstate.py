"""One replay study shared by runners in separate processes through its Postgres state
(plumbline_otel/replay/pgstate.py): every trial runs exactly once, the spend cap holds exactly,
and a killed runner's claim and reservation are released when its lease expires."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S, wait_for

from plumbline_otel.replay.jsonvalue import to_float
from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap, StudyClaims

RUNNER = str(Path(__file__).with_name("pg_runner.py"))
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
# The killed runner's lease: far beyond the few queries between its claim and the check that the claim is still held
# (seconds on a loaded machine; a 1 s lease could lapse first), and waited out by watching it lapse, not by a sleep.
DEAD_LEASE_S = 20


def _runners(url: str, study: str, trials: int, cap: float, n: int = 2, lease: str = "5", start: Path | None = None) -> list[dict]:
    """`n` runner processes on one study; with `start`, they begin claiming only once all of them have joined."""
    env = {**ENV, "LEASE_S": lease, **({"START_DIR": str(start)} if start else {})}
    procs = [subprocess.Popen([sys.executable, RUNNER, url, study, str(trials), str(cap), str(seed)], stdout=subprocess.PIPE, text=True,
                              env=env) for seed in range(n)]
    if start is not None:  # each joins once it has imported and connected (20 s and more under load): wait for all
        wait_for(lambda: len(list(start.glob("ready-*"))) == n or any(p.poll() is not None for p in procs), "every runner to join")
        (start / "go").touch()  # a runner that exited before it joined fails below, with its output
    outs = [p.communicate(timeout=EVENT_DEADLINE_S)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def test_two_runners_run_every_trial_exactly_once(postgres_db: str, tmp_path: Path) -> None:
    results = _runners(postgres_db, "shared", 60, 100.0, start=tmp_path)
    ran = [t for r in results for t in r["ran"]]
    assert sorted(ran) == [f"trial-{i:03d}" for i in range(60)]  # every trial, none twice
    assert all(r["ran"] for r in results)  # both runners took some
    ledger = PgLedger(postgres_db, "shared")
    outcomes = [r for r in ledger.rows if r.get("status") == "ok"]
    assert len(outcomes) == 60 and len({r["trial_id"] for r in outcomes}) == 60
    assert all(r["attempt"] == 1 for r in outcomes)
    cap = PgSpendCap(postgres_db, "shared", 100.0)
    assert cap.spent == pytest.approx(sum(to_float(r["attempt_cost_usd"]) for r in outcomes)) and cap.reserved == 0
    assert StudyClaims(postgres_db, "shared").counts() == {"decided": 60, "held": 0, "planned": 60}


def test_the_cap_holds_exactly_across_runners(postgres_db: str) -> None:
    results = _runners(postgres_db, "capped", 200, 1.5, n=3)
    cap = PgSpendCap(postgres_db, "capped", 1.5)
    assert cap.spent <= 1.5 + 1e-9 and cap.spent > 1.3  # it was used up, never passed
    assert all(r["high_water"] <= 1.5 + 1e-9 for r in results)  # spent + reserved never passed the cap, for any runner
    ran = [t for r in results for t in r["ran"]]
    assert len(ran) == len(set(ran)) and 0 < len(ran) < 200
    # a runner that comes later finds the account and the decided trials as they are
    assert PgSpendCap(postgres_db, "capped", 1.5).remaining == pytest.approx(1.5 - cap.spent)


def test_a_killed_runner_s_claim_and_reservation_are_released_after_its_lease(postgres_db: str) -> None:
    dead = subprocess.run([sys.executable, RUNNER, postgres_db, "lease", "3", "10", "0", "die"], capture_output=True, text=True,
                          env={**ENV, "LEASE_S": str(DEAD_LEASE_S)}, timeout=EVENT_DEADLINE_S)
    assert dead.returncode == 9, dead.stderr
    claimed = json.loads(dead.stdout)["claimed"]
    cap = PgSpendCap(postgres_db, "lease", 10.0)
    assert cap.reserved == pytest.approx(0.4)
    claims = StudyClaims(postgres_db, "lease", runner="checker", lease_s=1)
    assert not claims.claim(claimed)  # still under the dead runner's lease
    # Its runner's lease and its claim's lapse together (renewed together, the claim last): the wait ends when they have.
    wait_for(lambda: claims.counts()["held"] == 0, "the dead runner's lease to lapse", every_s=0.2)
    (result,) = _runners(postgres_db, "lease", 3, 10.0, n=1, lease="1")
    assert sorted(result["ran"]) == ["trial-000", "trial-001", "trial-002"]  # its trial ran, by the live runner
    assert result["released"] == pytest.approx(0.1)  # at what its calls metered
    after = PgSpendCap(postgres_db, "lease", 10.0)
    assert after.reserved == 0 and after.spent == pytest.approx(0.1 + sum(
        to_float(r["attempt_cost_usd"]) for r in PgLedger(postgres_db, "lease").rows if r.get("status") == "ok"))
    attempts = [r["attempt"] for r in PgLedger(postgres_db, "lease").rows if r.get("trial_id") == claimed and r.get("status") == "started"]
    assert attempts == [1, 2]  # the dead runner's attempt number is never reused
