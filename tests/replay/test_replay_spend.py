"""The spend cap is exact: no trial starts unless its reservation fits, and the ledger's account is
shared by every thread and process, so the cap is never passed by a cent.

The seed system reserved a default estimate of 0: adapters that reported their own cost spent
$3.30 on a $1.00 cap, and two processes on one study $1.80.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import pytest

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay import (
    Ledger,
    ReplayTask,
    SpanSink,
    SpendCap,
    StudyConfig,
    Trial,
    TrialBudget,
    TrialIdentity,
    TrialOutcome,
    TrialScope,
    run_study,
)
from plumbline_otel.replay.scope import activate

from .test_replay_cache import FakeModel, ask
from .toy import ToyAgent, tasks

ROOT = Path(__file__).resolve().parents[2]
CAP = 1.00
REPORTED_MAX = 0.03  # the declared per-trial maximum of the reporting adapter


def hammer(state: Path, seed: int) -> dict[str, Any]:
    """8 threads spending from one study account until it refuses: half the trials report their own
    cost (at most their declared maximum), half are metered call by call through the anthropic
    client's caching transport (a priced model behind a mock transport)."""
    cap = SpendCap(CAP, journal=state / "ledger.jsonl")
    model = FakeModel()
    client = model.client()
    started = [0, 0]
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(seed * 100 + n)
        refused = 0
        while refused < 3:
            metered = rng.random() < 0.5
            budget = TrialBudget.open(cap, 0.001 if metered else REPORTED_MAX)
            if budget is None:
                refused += 1
                continue
            with lock:
                started[metered] += 1
            reported = None
            try:
                if metered:
                    ident = TrialIdentity(f"s/t{seed}-{n}/baseline/0/k0", "baseline", "0", "s")
                    with activate(TrialScope(ident, budget=budget)):
                        for _ in range(rng.randint(1, 4)):
                            ask(client, f"call {rng.random()}")
                else:
                    reported = rng.uniform(0.0, REPORTED_MAX)
            except anthropic.APIStatusError:
                pass  # a metered call the cap refused: the agent stops there
            finally:
                budget.close(reported)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"reporting": started[0], "metered": started[1], "model_calls": len(model.calls), "high_water": cap.high_water}


def test_eight_threads_in_two_processes_never_pass_the_cap_by_a_cent(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    argv = [sys.executable, "-m", "tests.replay.study_proc", str(state), "-", "spend"]
    procs = [subprocess.Popen([*argv, f"{seed / 1000}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    (state / "go").touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["reporting"] > 0 and o["metered"] > 0 and o["model_calls"] > 0 for o in outs)  # both processes spent
    spent = Ledger(state / "ledger.jsonl").spent_usd()
    assert spent <= CAP + 1e-9  # never exceeded by a cent (nor by a fraction of one)
    assert spent > CAP - 0.05  # and the cap was actually reached
    assert all(o["high_water"] <= CAP + 1e-9 for o in outs)
    assert SpendCap(CAP, journal=state / "ledger.jsonl").reserved == pytest.approx(0.0)  # every reservation settled


def test_a_capped_study_without_a_reservation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="--trial-max-usd"):
        run_study(StudyConfig("c", budget_usd=1.0, state_dir=tmp_path / "s"), tasks(2), ToyAgent(cost_usd=0.5))


def test_the_reservation_comes_from_the_price_table_and_the_task_s_recorded_tokens(tmp_path: Path) -> None:
    # haiku-4-5: 10,000 in × $1/M + 2,000 out × $5/M = $0.02; reserved × 1.5 = $0.03
    priced = [ReplayTask(t.task_key, t.input, t.source_trajectory_id, "toy-agent", "1", 0, t.tools,
                         "claude-haiku-4-5", 10_000, 2_000) for t in tasks(10)]
    summary = run_study(StudyConfig("c", budget_usd=0.10, state_dir=tmp_path / "s", concurrency=1,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), priced, ToyAgent(cost_usd=0.02))
    assert [r.reserved_usd for r in summary.records if r.status == "ok"] == pytest.approx([0.03] * 3)
    # The agent's own report ($0.02) never lowers what no meter saw below its reservation: 3 × $0.03; a fourth would
    # need $0.09 + $0.03 > $0.10.
    assert summary.ok == 3
    assert summary.spent_usd == pytest.approx(0.09) and summary.budget_high_water_usd <= 0.10 + 1e-12
    assert {r.cost_basis for r in summary.records if r.status == "ok"} == {"reservation"}
    assert all(r.reason and "budget: not started" in r.reason for r in summary.records if r.status == "missing")


def test_a_report_over_the_declared_maximum_is_reconciled_and_stops_the_study(tmp_path: Path) -> None:
    inner = ToyAgent()

    def greedy(trial: Trial) -> TrialOutcome:
        outcome = inner.run(trial)
        outcome.cost_usd = 0.25 if trial.identity.task_key == "INV-1001" else 0.05
        return outcome

    summary = run_study(StudyConfig("c", budget_usd=1.0, trial_max_usd=0.10, state_dir=tmp_path / "s", concurrency=1,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), tasks(6), greedy)
    over = [r for r in summary.records if r.overrun_usd > 0]
    assert [r.task_key for r in over] == ["INV-1001"] and over[0].overrun_usd == pytest.approx(0.15)
    assert summary.ok == 2 and summary.missing == 4  # nothing started after the overrun
    assert "OVERRUN" in summary.render() and summary.as_dict()["overruns"][0]["overrun_usd"] == pytest.approx(0.15)
    assert summary.spent_usd == pytest.approx(0.35)  # $0.10 reserved (its $0.05 report lowers nothing), then $0.25 reported


# --- pricing from the provider's full usage (issue 26 item 6) ------------------------------------

from plumbline_otel.replay.pricing import Usage, extract_usage, model_price, parse_sse, price  # noqa: E402


def test_the_price_table_prices_cache_reads_and_writes_for_anthropic() -> None:
    usage = extract_usage({"type": "message", "model": "claude-sonnet-4-5-20250929", "usage": {
        "input_tokens": 1_000, "output_tokens": 2_000, "cache_read_input_tokens": 100_000, "cache_creation_input_tokens": 50_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 30_000, "ephemeral_1h_input_tokens": 20_000}}})
    assert usage == Usage(1_000, 2_000, 100_000, 30_000, 20_000, model="claude-sonnet-4-5-20250929")
    # $3 input, $15 output, $0.30 cache read, $3.75 5-minute write, $6 1-hour write, per million tokens
    assert price(None, usage) == pytest.approx((1_000 * 3 + 2_000 * 15 + 100_000 * 0.3 + 30_000 * 3.75 + 20_000 * 6) / 1e6)
    # The case: prompt-cache tokens that the old meter ignored are most of the money.
    old = (1_000 * 3 + 2_000 * 15) / 1e6
    assert price(None, usage) > 8 * old  # type: ignore[operator]


def test_sonnet_4_prompts_past_200k_tokens_are_priced_at_the_long_context_rate() -> None:
    usage = Usage(input_tokens=150_000, output_tokens=1_000, cache_read_tokens=60_000)
    assert price("claude-sonnet-4-20250514", usage) == pytest.approx((150_000 * 6 + 1_000 * 22.5 + 60_000 * 0.6) / 1e6)
    assert price("claude-haiku-4-5", usage) == pytest.approx((150_000 * 1 + 1_000 * 5 + 60_000 * 0.1) / 1e6)


@pytest.mark.parametrize(("body", "expected"), [
    ({"object": "chat.completion", "model": "gpt-4o", "usage": {"prompt_tokens": 10_000, "completion_tokens": 500, "total_tokens": 10_500,
                                                                "prompt_tokens_details": {"cached_tokens": 8_000}}},
     (2_000 * 2.5 + 8_000 * 1.25 + 500 * 10) / 1e6),
    ({"object": "response", "model": "gpt-5-mini", "usage": {"input_tokens": 10_000, "input_tokens_details": {"cached_tokens": 9_000},
                                                             "output_tokens": 700, "output_tokens_details": {"reasoning_tokens": 600},
                                                             "total_tokens": 10_700}},
     (1_000 * 0.25 + 9_000 * 0.025 + 700 * 2.0) / 1e6),
])
def test_openai_cached_tokens_are_carved_out_of_the_input(body: dict[str, Any], expected: float) -> None:
    usage = extract_usage(body)
    assert usage is not None and price(None, usage) == pytest.approx(expected)


def test_usage_is_read_from_each_api_s_stream() -> None:
    anthropic_stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-haiku-4-5","usage":{"input_tokens":10,'
        b'"cache_read_input_tokens":400,"cache_creation_input_tokens":30,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":77}}\n\n')
    assert extract_usage(parse_sse(anthropic_stream)) == Usage(10, 77, 400, 30, model="claude-haiku-4-5")
    chat_stream = (b'data: {"model":"gpt-4o-mini","choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
                   b'data: {"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":5,'
                   b'"prompt_tokens_details":{"cached_tokens":20}}}\n\ndata: [DONE]\n\n')
    assert extract_usage(parse_sse(chat_stream)) == Usage(30, 5, 20, model="gpt-4o-mini")
    responses_stream = (b'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n'
                        b'event: response.completed\ndata: {"type":"response.completed","response":{"model":"o4-mini","usage":'
                        b'{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"total_tokens":12}}}\n\n')
    assert extract_usage(parse_sse(responses_stream)) == Usage(9, 3, model="o4-mini")
    assert extract_usage(parse_sse(b'data: {"choices":[]}\n\n')) is None


def test_model_ids_resolve_by_longest_prefix_and_unknown_models_are_unpriced() -> None:
    assert model_price("gpt-4o-mini-2024-07-18") == model_price("gpt-4o-mini") != model_price("gpt-4o")
    assert model_price("anthropic/claude-haiku-4-5") == model_price("claude-haiku-4-5")
    assert model_price("mystery-7b") is None and price("mystery-7b", Usage(1, 1)) is None
    assert price("simulated-model", Usage(10**6, 10**6)) == 0.0


def test_no_cap_means_no_cap_an_adapter_s_reported_cost_stops_nothing(tmp_path: Path) -> None:
    """Issue 39 item 6: with no --budget-usd and no --trial-max-usd, a reported cost is recorded, never an overrun."""
    summary = run_study(StudyConfig("c", state_dir=tmp_path / "s", concurrency=1, grace_s=0.0,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), tasks(4), ToyAgent(cost_usd=0.5))
    assert (summary.ok, summary.missing) == (4, 0)
    assert "OVERRUN" not in summary.render() and summary.spent_usd == pytest.approx(2.0)
    assert {r.cost_basis for r in summary.records} == {"adapter"}
