"""A replay runner's use of the Postgres study state, as a process of its own (tests/lake/test_pgstate.py).

    python pg_runner.py URL STUDY TRIALS CAP SEED [die-after-reserving]
With START_DIR set, it writes ready-SEED there once it has joined the study and waits for a file `go`,
so that runners started together claim together however slowly the machine starts them. It claims trials until none is left (or the cap refuses one), spends on each through the shared cap in
several metered calls, records each outcome in the shared ledger, and prints one JSON summary line.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from plumbline_otel.replay.budget import BudgetExceeded, TrialBudget
from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap, StudyClaims


def _wait_for_start(seed: int) -> None:
    start = os.environ.get("START_DIR")
    if not start:
        return
    open(os.path.join(start, f"ready-{seed}"), "w").close()
    # `go` comes once every runner has joined: however slowly the machine starts them. This deadline (longer than the
    # test's wait for the runners to join) only bounds a hang, and a runner never told to go fails rather than run alone.
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(start, "go")):
        if time.monotonic() > deadline:
            sys.exit("never told to go: the other runners did not join")
        time.sleep(0.01)


def main() -> None:
    url, study, trials, cap_usd, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    die = len(sys.argv) > 6
    claims = StudyClaims(url, study, lease_s=float(os.environ.get("LEASE_S", "5")))
    cap = PgSpendCap(url, study, cap_usd, runner=claims.runner)
    ledger = PgLedger(url, study)
    claims.plan([f"trial-{i:03d}" for i in range(trials)])
    claims.start_heartbeat()
    _wait_for_start(seed)
    rng = random.Random(seed)
    ran: list[str] = []
    if die:  # claim one trial, reserve and meter part of it, then die without a word
        tid = claims.claim_next()
        assert tid is not None
        budget = TrialBudget.open(cap, 0.4)
        assert budget is not None
        budget.add(0.1)
        ledger.begin_attempt(tid)
        print(json.dumps({"claimed": tid}), flush=True)
        os._exit(9)
    released = sum(r.used for r in cap.release_dead())
    while (tid := claims.claim_next()) is not None:
        attempt = ledger.begin_attempt(tid)
        budget = TrialBudget.open(cap, 0.05)
        if budget is None:
            ledger.append({"trial_id": tid, "attempt": attempt, "status": "missing", "reason": "budget"})
            claims.finish(tid, decided=False)
            break
        try:
            for _ in range(rng.randint(1, 4)):
                cost = rng.uniform(0.005, 0.04)
                budget.ensure(cost)
                time.sleep(0)
                budget.add(cost)
            status = "ok"
        except BudgetExceeded:
            status = "ok"  # the agent ran; its refused call cost nothing
        spent = budget.close()
        ledger.append({"trial_id": tid, "attempt": attempt, "status": status, "attempt_cost_usd": spent, "runner": claims.runner})
        claims.finish(tid, decided=True)
        ran.append(tid)
    claims.close()
    print(json.dumps({"runner": claims.runner, "ran": ran, "high_water": cap.high_water, "spent": cap.spent, "released": released}), flush=True)


if __name__ == "__main__":
    main()
