"""A replay runner as a process of its own, for tests/replay/test_interrupt.py (issue 39 item 5).

    python interrupt_runner.py STATE SPANS GATE

Four trials, two at a time, of a command agent that writes ``GATE/started-<pid>`` and then sleeps for five minutes,
ignoring SIGTERM (so only the runner's SIGKILL after its grace ends it). SIGTERM is made a stop, as `plumbline replay`
makes it (`adapters.stop_on_sigterm`).
"""

from __future__ import annotations

import sys

from plumbline_otel.replay import SpanSink, StudyConfig, run_study
from plumbline_otel.replay.adapters import CommandAdapter, stop_on_sigterm
from replay.toy import tasks  # tests/ on the path (test_interrupt.py's PYTHONPATH): one name for toy.py, as the other tests use

AGENT = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1], f"started-{os.getpid()}").touch()
time.sleep(300)
"""


def main() -> None:
    state, spans, gate = sys.argv[1:4]
    stop_on_sigterm()
    adapter = CommandAdapter([sys.executable, "-c", AGENT, gate], service="stubborn")
    adapter.grace_s = 2.0
    sink = SpanSink(otlp_file=spans)
    config = StudyConfig("stop", repeats=4, concurrency=2, state_dir=state, sink=sink, budget_usd=5.0, trial_max_usd=0.25)
    try:
        run_study(config, tasks(1), adapter)
    finally:
        sink.close()


if __name__ == "__main__":
    main()
