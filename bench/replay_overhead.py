"""Replay driver overhead: milliseconds the driver adds per trial, beside a bare loop (the peer).

    .venv/bin/python bench/replay_overhead.py [--trials 3000] [--concurrency 4] [--sleep-ms 0]

The agent under test is a no-op Python adapter (or one that sleeps ``--sleep-ms``, standing in
for model time) that, when the study has a span sink, exports one agent span per trial (a trial
is done only once its trace reached the sink). Measured in one process, same trials, same adapter:

- peer: a bare ``for trial in plan.trials: adapter.run(trial)`` loop;
- driver, lean: ``run_study`` with no state directory and no span sink, one worker;
- driver, full: ``run_study`` with the ledger (one fsync-free append per trial), the variants file,
  the response cache open, a span sink for markers, and ``--concurrency`` workers;
- of which planning: ``plan_study`` alone (variants, guard, trial identities), per trial.

Per row: ms/trial and the ratio to the peer. With a no-op adapter the ratio is large by
construction (the peer does nothing); the number that matters (docs/performance.md's budget: "the driver
adds milliseconds per trial on top of the model's own time") is the absolute overhead, printed
beside it. Results also go to bench/out/replay_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

from plumbline_otel.replay import PythonAdapter, ReplayTask, SpanSink, StudyConfig, Trial, plan_study, run_study  # noqa: E402

PERTURBATIONS = ("baseline", "paraphrase", "distractor", "decoy_tools", "sampling", "tool_fault")


def make_tasks(n: int) -> list[ReplayTask]:
    return [ReplayTask(f"INV-{1000 + i}", f"Please pay invoice INV-{1000 + i} from Vendor {i % 17} for {100 + i},250.00 GBP "
                       f"by 2026-03-{1 + i % 28:02d}.", f"src-{i}", "bench-agent", "1", i, ("lookup", "check", "pay"))
            for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="adapter time per trial (stand-in for the model)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    per_task = len(PERTURBATIONS) * args.repeats
    tasks = make_tasks(max(1, args.trials // per_task))
    sleep_s = args.sleep_ms / 1000

    providers: dict[int, TracerProvider] = {}

    def agent(trial: Trial) -> None:
        if sleep_s:
            time.sleep(sleep_s)
        if trial.sink is not None:
            provider = providers.get(id(trial.sink))
            if provider is None:
                provider = providers[id(trial.sink)] = TracerProvider()
                provider.add_span_processor(SimpleSpanProcessor(trial.sink.exporter()))
            provider.get_tracer("bench").start_span("invoke_agent bench").end()

    adapter = PythonAdapter(agent)
    base = dict(perturbations=PERTURBATIONS, repeats=args.repeats)

    t0 = time.perf_counter()
    plan = plan_study(StudyConfig("bench", **base), tasks)
    plan_s = time.perf_counter() - t0
    n = len(plan.trials)

    t0 = time.perf_counter()
    for trial in plan.trials:
        adapter.run(trial)
    peer_s = time.perf_counter() - t0

    lean = run_study(StudyConfig("lean", concurrency=1, **base), tasks, adapter)
    assert lean.ok == n, lean.render()
    with tempfile.TemporaryDirectory() as tmp:
        full_config = StudyConfig("full", concurrency=args.concurrency, state_dir=Path(tmp) / "state",
                                  sink=SpanSink(otlp_file=os.path.join(tmp, "spans.jsonl")), **base)
        full = run_study(full_config, tasks, adapter)
        full_config.sink.close()
    assert full.ok == n, full.render()

    def ms(seconds: float) -> float:
        return seconds / n * 1000

    peer_ms = ms(peer_s)
    rows = {
        "peer: bare loop": peer_ms,
        "driver, lean (1 worker, no state)": ms(lean.seconds),
        f"driver, full ({args.concurrency} workers, ledger, cache, sink)": ms(full.seconds),
    }
    print(f"replay driver overhead: {n} trials ({len(tasks)} tasks x {len(PERTURBATIONS)} perturbations x {args.repeats} "
          f"repeats), adapter {'no-op' if not sleep_s else f'sleeping {args.sleep_ms:g} ms'}, {os.cpu_count()} cores")
    print(f"  {'':<52} {'ms/trial':>9} {'x peer':>9} {'+ms/trial':>10}")
    for label, value in rows.items():
        ratio = value / peer_ms if peer_ms > 0 else float("inf")
        print(f"  {label:<52} {value:9.4f} {ratio:9.1f} {value - peer_ms:10.4f}")
    print(f"  of which planning (variants, guard, trial ids): {ms(plan_s):.4f} ms/trial")
    if sleep_s:
        print("  (with a sleeping adapter the full row runs trials concurrently, so it can beat the sequential peer)")
    out = Path(__file__).resolve().parent / "out" / "replay_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"trials": n, "tasks": len(tasks), "concurrency": args.concurrency, "sleep_ms": args.sleep_ms,
                               "ms_per_trial": rows, "planning_ms_per_trial": ms(plan_s), "ratio_to_peer": {k: (v / peer_ms if peer_ms else None) for k, v in rows.items()}},
                              indent=2) + "\n")


if __name__ == "__main__":
    main()
