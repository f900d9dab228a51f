"""A store for the page tests: the retry-vs-no-retry pair from the reference domain, and a hostile trace.

`retry_fault/` holds the OTLP JSON lines written by
``plumbline domain run accounts_payable --arm ARM --task INV-1001 --fault check_duplicate:503
--offline --imperfections stop_retrying=1.0 --otlp-file retry_fault/ARM.otlp.jsonl`` for ARM
plan_execute and plan_execute_retry (the simulated model): on the same task and fault, the arm
without retry flags an exception and the arm with retry pays.

The hostile trace is two agents on one task whose every value is markup: pages must show it as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from otlp import record, to_otlp_json

from plumbline_otel.analyse.conformance import check
from plumbline_otel.ingest import ingest_files
from plumbline_otel.report import build_certificate, write_report
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

REPO = Path(__file__).resolve().parents[2]
RETRY_FAULT = Path(__file__).parent / "retry_fault"
SPEC = REPO / "configs" / "accounts_payable.invariants.yaml"
NO_RETRY, WITH_RETRY = "ap-agent-plan_execute", "ap-agent-plan_execute_retry"

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src="x" onerror="window.__pwned = 2">'
BREAKOUT = "</td></tr></table><h1 id=owned>owned</h1>"
HOSTILE_TASK = "<i>task</i>&amp;"
HOSTILE_AGENTS = ("<script>agent-a</script>", "agent-b<b>")  # A (the reference) and B of their diff


def _hostile_run(service: str, tool: str, amount: float) -> dict:
    def build(tracer) -> None:  # type: ignore[no-untyped-def]
        with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent", "session.id": HOSTILE_TASK}):
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "session.id": HOSTILE_TASK,
                "gen_ai.tool.call.arguments": json.dumps({"note": IMG, "amount": amount}),
                "gen_ai.tool.call.result": BREAKOUT,
            }):
                pass

    return to_otlp_json(record(build, service=service))


@dataclass(frozen=True)
class Built:
    db: Path
    cert: Path
    report: Path


def build_store(root: Path) -> Built:
    """Ingest both fixtures, judge with the AP spec, certify, and write the report."""
    root.mkdir(parents=True, exist_ok=True)
    hostile = root / "hostile.otlp.jsonl"
    hostile.write_text("\n".join(json.dumps(_hostile_run(s, SCRIPT, amount)) for s, amount in zip(HOSTILE_AGENTS, (28500.00, 285000.00))) + "\n")
    db, cert_path = root / "pages.duckdb", root / "cert.json"
    spec = load_spec(SPEC)
    with Store(db) as store:
        ingest_files(store, [str(RETRY_FAULT), str(hostile)])
        store.assemble()
        check(spec, store.trajectories(), store.connection)
        cert = build_certificate(spec, store.trajectories())
    cert_path.write_text(json.dumps(cert, indent=2))
    return Built(db, cert_path, write_report(db, cert_path, root / "report.html"))
