"""A replay runner in its own process, for the tests of what two processes may do to one study.

    python -m tests.replay.study_proc STATE_DIR OTLP_FILE {resume|spend} [ARG]

``resume`` runs a 16-trial study with ``--resume`` semantics (the toy agent, slowed down so two
runners overlap) and prints the summary as JSON; a refused runner prints ``{"locked": reason}``.
``spend`` hammers the study's spend account from 8 threads, ARG × 1000 seeding it (see
test_replay_spend.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from plumbline_otel.replay import RetryPolicy, SpanSink, StudyConfig, StudyLocked, Trial, run_study

from .toy import ToyAgent, tasks


class SlowToy(ToyAgent):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def run(self, trial: Trial):
        time.sleep(self.seconds)
        return super().run(trial)


def _resume(state: Path, otlp: str, seconds: float) -> dict[str, object]:
    config = StudyConfig("twice", repeats=2, concurrency=2, resume=True, state_dir=state,
                         sink=SpanSink(otlp_file=otlp), retry=RetryPolicy(base_delay_s=0.001))
    try:
        summary = run_study(config, tasks(8), SlowToy(seconds))
    except StudyLocked as exc:
        return {"locked": str(exc)}
    return {"ran": [r.trial_id for r in summary.records], "ok": summary.ok, "skipped": summary.skipped}


def main(argv: list[str]) -> None:
    state, otlp, mode = Path(argv[0]), argv[1], argv[2]
    seconds = float(argv[3]) if len(argv) > 3 else 0.05
    if mode == "resume":
        print(json.dumps(_resume(state, otlp, seconds)))
    elif mode == "spend":
        from .test_replay_spend import hammer

        print("ready", flush=True)
        while not (state / "go").exists():  # start together with the other process
            time.sleep(0.01)
        print(json.dumps(hammer(state, seed=int(seconds * 1000))))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
