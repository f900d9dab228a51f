"""The per-step robustness profile in docs/replay.md ("Branch-point replay"), made by running it:
``python -m tests.replay.branch_profile_demo`` (from the repository's root, a minute on one core).

The agent is tests/replay/test_branch_turns.py's two-turn conversation (look an invoice up, then pay it: six steps),
through the model-API proxy, against the simulated provider, on three tasks. Its model tries a failed payment again
(PAY-ONCE forbids paying twice), except on INV-1001, where after any failed tool call it does not pay at all (PAY). The study branches at each step (tool_fault at
the tool steps, model_fault at the model steps, the prefix from each task's recorded baseline), the certificate is
made by `plumbline certify`, and the profile is drawn from its cells: one row per step, the bar the share of
tasks that conformed, ``[`` and ``]`` the gate's bounds."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.replay import RetryPolicy, SpanSink, StudyConfig, run_study
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider
from plumbline_otel.replay.tape import parse_branch_at, tape_for_task

from .test_branch_turns import SPEC, conversation, script
from .toy import tasks

WIDTH = 40


def stubborn_unless_1001(api: str, body: dict[str, Any]) -> SimReply:
    """The conversation's model, which on INV-1001 does not pay once a tool call of the conversation has failed."""
    reply = script(api, body)
    if "INV-1001" in json.dumps(body) and reply.tool_calls and reply.tool_calls[0][0] == "pay":
        since = [m for m in body.get("messages") or [] if m.get("role") == "tool"]
        if since and "error" in str(since[-1].get("content")):
            return SimReply(text="could not pay", input_tokens=100, output_tokens=10)
    return reply


def study(root: Path, name: str, sim: SimulatedProvider, **kw: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    sink = SpanSink(otlp_file=str(root / f"{name}.jsonl"))
    spans = TracerProvider(resource=Resource.create({"service.name": "toy-agent", "service.version": "1"}))
    spans.add_span_processor(SimpleSpanProcessor(sink.exporter()))
    with ModelProxy(sim.upstreams(), ResponseCache(root / name / "responses.jsonl"), env={}, tracer_provider=spans) as proxy:
        config = StudyConfig(name, sink=sink, state_dir=root / name, proxies=[proxy], grace_s=0.0, concurrency=1,
                             retry=RetryPolicy(max_attempts=1), **kw)
        return run_study(config, tasks(3), conversation())


def draw(cells: dict[str, dict[str, Any]]) -> str:
    """One row per branch point in step order: conforming/n, the bar, the gate's bounds."""
    rows = []
    for label in sorted(cells, key=lambda p: int(p.partition("@")[2])):
        c = cells[label]
        rate = c["conforming"] / c["n"] if c["n"] else 0.0
        bar = ["#" if i < round(rate * WIDTH) else "." for i in range(WIDTH)]
        lo, hi = round(c["gate_lower"] * (WIDTH - 1)), round(c["gate_upper"] * (WIDTH - 1))
        bar[lo], bar[hi] = "[", "]"
        rows.append(f"step {label.partition('@')[2]}  {label:<14} {c['conforming']}/{c['n']}  |{''.join(bar)}|  "
                    f"[{c['gate_lower']:.2f}, {c['gate_upper']:.2f}] {c['verdict']}")
    return "\n".join(rows)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="branch-profile-"))
    sim = SimulatedProvider(stubborn_unless_1001).start()
    try:
        study(root, "src", sim)
        tapes = {t.task_key: tape_for_task(root / "src" / "responses.jsonl", t.task_key) for t in tasks(3)}
        study(root, "each", sim, perturbations=("tool_fault", "model_fault"), branch_at=parse_branch_at("each"), tapes=tapes)
    finally:
        sim.stop()
    runner = CliRunner()
    db = root / "each.duckdb"
    runner.invoke(cli, ["ingest", str(root / "each.jsonl"), "--db", str(db), "--quiet"])
    (root / "spec.yaml").write_text(SPEC)
    out = root / "each.cert.json"
    done = runner.invoke(cli, ["certify", "--spec", str(root / "spec.yaml"), "--db", str(db), "--study", "each",
                               "--state", str(root / "each"), "--out", str(out), "--format", "text"])
    if done.exit_code != 0:
        sys.exit(done.output)
    cells = {c["perturbation"]: c for a in json.loads(out.read_text())["agents"] for c in a["perturbations"]}
    print("\n".join(line.strip() for line in done.output.splitlines() if "profile over steps" in line))
    print()
    print(draw(cells))


if __name__ == "__main__":
    main()
