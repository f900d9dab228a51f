"""One runner of a shared replay study (`run_study` with `--state-url`), as a process of its own, for the fault tests
in tests/lake/test_shared_study_faults.py.

    python study_runner.py URL STATE SPANS GATE TRIALS

Its agent (the toy agent, reporting $0.10 a run) writes ``GATE/started-<pid>-<n>`` when an attempt begins and then waits
for ``GATE/open`` before it runs, so a test can pause, stop or cut the runner off while attempts are in flight,
whatever the machine's speed. It prints one JSON line: every record of this runner and the study's spend.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

from replay.toy import ToyAgent, tasks  # tests/ on the path (the test sets PYTHONPATH): one name for toy.py

from plumbline_otel.replay import SpanSink, StudyConfig, run_study
from plumbline_otel.replay.adapters import Trial, TrialOutcome

_COUNT = itertools.count(1)


class Gated(ToyAgent):
    """The toy agent, held at its start until the test opens the gate."""

    def __init__(self, gate: Path) -> None:
        super().__init__(cost_usd=0.1)
        self.gate = gate

    def run(self, trial: Trial) -> TrialOutcome:
        (self.gate / f"started-{os.getpid()}-{next(_COUNT)}").write_text(trial.trial_id)
        deadline = time.monotonic() + 300
        while not (self.gate / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().run(trial)


def main() -> None:
    url, state, spans, gate, trials = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
    sink = SpanSink(otlp_file=spans)
    config = StudyConfig("faults", repeats=1, concurrency=2, state_url=url, state_dir=state, sink=sink,
                         budget_usd=10.0, trial_max_usd=0.1, trace_wait_s=30.0)
    summary = run_study(config, tasks(trials), Gated(gate))
    sink.close()
    print(json.dumps({"records": [{"trial_id": r.trial_id, "status": r.status, "reason": r.reason, "attempt": r.attempt}
                                  for r in summary.records],
                      "recovered": [r.trial_id for r in summary.recovered], "elsewhere": summary.elsewhere,
                      "spent": summary.spent_usd, "render": summary.render()}), flush=True)


if __name__ == "__main__":
    main()
