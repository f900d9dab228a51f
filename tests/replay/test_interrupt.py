"""Issue 39 item 5: a runner stopped with SIGTERM or Ctrl-C (SIGINT) says what it is doing and ends promptly, even with
agents that ignore SIGTERM; the started trials are recorded interrupted (missing, "interrupted: …") with their spend, the
queued ones "not started: interrupted". Waits are on files and process exits with generous deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = str(Path(__file__).with_name("interrupt_runner.py"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_runner_records_its_started_trials_interrupted_and_ends(sig: signal.Signals, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = subprocess.Popen([sys.executable, RUNNER, str(tmp_path / "state"), str(tmp_path / "spans.jsonl"), str(gate)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(gate.glob("started-*"))) < 2:  # both running attempts have reached their agents
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    agents = [int(p.name.split("-")[1]) for p in gate.glob("started-*")]
    proc.send_signal(sig)
    # The agents sleep five minutes and ignore SIGTERM: the runner ends only because it stops them (SIGKILL after 2 s).
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "stopping; 2 attempt(s) running, 2 agent(s) sent SIGTERM" in err and "2 queued trial(s) recorded as not started" in err
    assert "2 attempt(s) recorded interrupted" in err
    for pid in agents:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the agents are gone, not left running
    rows = [json.loads(line) for line in (tmp_path / "state" / "ledger.jsonl").read_text().splitlines() if line.strip()]
    outcomes = [r for r in rows if r.get("trial_id") and r.get("status") not in (None, "started")]
    interrupted = [r for r in outcomes if str(r["reason"]).startswith("interrupted: the runner was stopped during")]
    queued = [r for r in outcomes if str(r["reason"]).startswith("not started: interrupted")]
    assert len(interrupted) == 2 and len(queued) == 2 and len(outcomes) == 4
    assert all(r["status"] == "missing" for r in outcomes)
    # The agents ran (unmetered): each interrupted attempt is charged its reservation, never $0; the queued cost nothing.
    assert [r["attempt_cost_usd"] for r in interrupted] == [0.25, 0.25] and [r["attempt_cost_usd"] for r in queued] == [0.0, 0.0]
