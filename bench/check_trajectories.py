"""Bench: conformance `check` (and a certificate) over 100,000 synthetic trajectories.

    python bench/check_trajectories.py [--n 100000] [--db bench/out/check.duckdb] [--store]

Builds AP-like runs (8-10 tool calls and 3 model calls each, with failed calls, retries, wrong
amounts, skipped checks and missing trials mixed in), a spec with every invariant kind, and times:
1. evaluation alone (the invariants over every run),
2. `check` writing violations to a DuckDB file (and a second, idempotent run),
3. building the certificate,
4. with --store: the same runs ingested as spans into a real store, then `check` reading them back.
Reports trajectories/s for each. Budget (docs/performance.md): seconds, not minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbline_otel.analyse.conformance import check  # noqa: E402
from plumbline_otel.model import Step, Trajectory  # noqa: E402
from plumbline_otel.report import build_certificate  # noqa: E402
from plumbline_otel.spec import parse_spec  # noqa: E402

SPEC = """
version: 1
name: bench
invariants:
  - {id: VENDOR-FIRST, severity: critical, ordering: [check_vendor_status, schedule_payment]}
  - {id: PAY-ONCE, severity: critical, call_at_most: {tool: schedule_payment, n: 1}}
  - id: PAY-AMOUNT
    severity: critical
    when: {expected_action: pay}
    arg_equals: {tool: schedule_payment, arg: amount, from_context: payable_amount, type: number, tolerance: 0.005}
  - id: NO-PAY-HELD
    severity: critical
    when: {expected_action: {in: [hold, apply_credit]}}
    must_not_call: schedule_payment
  - id: REASON
    severity: major
    when: {expected_action: hold}
    arg_equals: {tool: flag_exception, arg: reason_code, from_context: primary_reason_code, type: identifier}
  - id: PAID-EQUALS-PAYABLE
    severity: critical
    arg_matches_result: {tool: schedule_payment, arg: amount, result_tool: calculate_payable_amount, field: payable_amount, type: number, tolerance: 0.005}
  - {id: LOOKED-UP, severity: minor, call_at_least: {tool: get_invoice, n: 1}}
  - {id: AUDIT, severity: minor, must_call: post_audit_log}
"""

TASKS = 200
PERTURBATIONS = ("baseline", "paraphrase", "distractor", "decoy_tools", "sampling", "tool_fault")


def context_table() -> dict[str, dict]:
    rng = random.Random(1)
    table = {}
    for i in range(TASKS):
        action = "pay" if i % 3 else rng.choice(["hold", "apply_credit"])
        table[f"INV-{i:04d}"] = {"expected_action": action, "payable_amount": round(100 + i * 37.25, 2),
                                 "primary_reason_code": "PRICE_VARIANCE"}
    return table


def tool(name: str, t: int, args=None, result=None, error=None) -> Step:
    return Step(kind="tool_call", name=name, args=args or {}, result=result, error=error, start_ns=t)


def synth(i: int, ctx: dict[str, dict], rng: random.Random) -> Trajectory:
    task = f"INV-{i % TASKS:04d}"
    truth = ctx[task]
    pert = PERTURBATIONS[i % len(PERTURBATIONS)]
    base = 1_700_000_000_000_000_000 + i * 1_000_000
    if rng.random() < 0.01:
        return Trajectory(f"{i:032x}", f"{i:032x}", task, "attribute:bench", "ap-agent", "1.0", None, None, None,
                          ("genai",), (), base, base, {"plumbline.perturbation": pert, "plumbline.trial.status": "missing"})
    amount = truth["payable_amount"] * (10 if rng.random() < 0.02 else 1)
    steps = [Step(kind="llm_call", name="claude", start_ns=base), tool("get_invoice", base + 1, {"invoice_id": task}, {"id": task})]
    if rng.random() > 0.03:
        if pert == "tool_fault" and rng.random() < 0.5:
            steps.append(tool("check_vendor_status", base + 2, {"vendor": "V1"}, error="503 upstream"))
        steps.append(tool("check_vendor_status", base + 3, {"vendor": "V1"}, {"status": "active"}))
    steps.append(Step(kind="llm_call", name="claude", start_ns=base + 4))
    steps.append(tool("calculate_payable_amount", base + 5, {"invoice_id": task}, {"payable_amount": truth["payable_amount"]}))
    if truth["expected_action"] == "pay" or rng.random() < 0.02:
        steps.append(tool("schedule_payment", base + 6, {"invoice_id": task, "amount": amount}, {"payment_id": f"P{i}"}))
        if rng.random() < 0.01:
            steps.append(tool("schedule_payment", base + 7, {"invoice_id": task, "amount": amount}, {"payment_id": f"Q{i}"}))
    else:
        steps.append(tool("flag_exception", base + 6, {"invoice_id": task, "reason_code": "price_variance "}))
    steps.append(Step(kind="llm_call", name="claude", start_ns=base + 8))
    if rng.random() > 0.05:
        steps.append(tool("post_audit_log", base + 9, {"invoice_id": task, "detail": "done"}))
    return Trajectory(f"{i:032x}", f"{i:032x}", task, "attribute:bench", "ap-agent", "1.0", None, None, None,
                      ("genai",), tuple(steps), base, base + 10, {"plumbline.perturbation": pert})


def timed(label: str, n: int, fn):
    start = time.perf_counter()
    out = fn()
    secs = time.perf_counter() - start
    print(f"{label:<44} {secs:8.2f} s   {n / secs:>10,.0f} trajectories/s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--db", default=None, help="DuckDB file for the violations (default: a temp file)")
    ap.add_argument("--store", action="store_true", help="also ingest the runs as spans into a real store and check from it")
    args = ap.parse_args()

    ctx = context_table()
    spec = parse_spec(SPEC)
    spec = dataclasses.replace(spec, context_provider=lambda k: ctx.get(k, {}))
    rng = random.Random(7)
    runs = timed(f"build {args.n:,} synthetic trajectories", args.n, lambda: [synth(i, ctx, rng) for i in range(args.n)])
    steps = sum(len(t.steps) for t in runs)
    print(f"  {steps:,} steps, {sum(len(t.tool_steps) for t in runs):,} tool calls")

    summary = timed("evaluate (no store)", args.n, lambda: check(spec, runs))
    print(f"  runs judged {summary.runs:,}, missing {summary.missing:,}, critical-conforming {summary.critical_conforming:,}")

    from plumbline_otel.store import Store

    tmp = tempfile.mkdtemp(prefix="plumbline-bench-")
    db = args.db or os.path.join(tmp, "check.duckdb")
    with Store(db) as violations_store:
        first = timed("check + write violations (DuckDB file)", args.n, lambda: check(spec, runs, violations_store))
        again = timed("check again (idempotent rewrite)", args.n, lambda: check(spec, runs, violations_store))
        stored = violations_store.connection.execute("SELECT count(*) FROM violations").fetchone()[0]
    print(f"  violations written {first.violations_written:,} then {again.violations_written:,}; rows stored {stored:,}")

    cert = timed("build certificate", args.n, lambda: build_certificate(spec, runs))
    head = cert.headline
    print(f"  headline {head.lower_bound:.4f} set by {[c.perturbation for c in head.cells]}")

    if args.store:
        from plumbline_otel.spec.testing import span_records

        path = os.path.join(tmp, "store.duckdb")
        with Store(path) as store:
            def ingest():
                batch = []
                for t in runs:
                    batch.extend(span_records(t))
                    if len(batch) >= 50_000:
                        store.write_spans(batch)
                        batch = []
                if batch:
                    store.write_spans(batch)
                return store.assemble()

            timed("store: ingest spans + assemble (setup)", args.n, ingest)
            timed("store: check reading from the store", args.n, lambda: check(spec, store.trajectories(), store))


if __name__ == "__main__":
    main()
