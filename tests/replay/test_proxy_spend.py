"""The spend cap holds exactly through the model-API proxy: plain and streamed calls from many threads,
two processes sharing one journal, and cassette hits that cost nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from plumbline_otel.replay.budget import SpendCap, TrialBudget
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider

from .proxy_helpers import ANTHROPIC_MODEL, anthropic_client, trial

REPO = Path(__file__).resolve().parents[2]
PER_CALL = (1000 * 1.0 + 50 * 5.0 + 500 * 0.10 + 300 * 1.25) / 1e6  # haiku 4.5 with cache reads and writes


def _script(api: Any, body: dict[str, Any]) -> SimReply:
    return SimReply(text="ok", input_tokens=1000, output_tokens=50, cache_read_tokens=500, cache_write_tokens=300)


def run_trials(proxy: ModelProxy, cap: SpendCap, workers: int, prefix: str = "") -> list[Any]:
    """``workers`` threads each run trials of alternately plain and streamed calls until the cap refuses one."""
    evidence: list[Any] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for k in range(1000):
            budget = TrialBudget.open(cap, 0.0)
            assert budget is not None
            route = proxy.open_trial(trial(k=k, perturbation=f"{prefix}w{w}"), budget)
            client = anthropic_client(route)
            refused = False
            try:
                for i in range(3):
                    ask: dict[str, Any] = {"model": ANTHROPIC_MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": f"call {i}"}]}
                    if i % 2:
                        with client.messages.stream(**ask) as stream:
                            stream.get_final_message()
                    else:
                        client.messages.create(**ask)
            except anthropic.RateLimitError:
                refused = True
            seen = proxy.close_trial(route)
            assert budget.close() == pytest.approx(seen.cost_usd)  # settled at exactly what the proxy metered
            with lock:
                evidence.append(seen)
            if refused:
                return

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return evidence


def test_the_cap_holds_exactly_across_threads_for_plain_and_streamed_calls() -> None:
    sim = SimulatedProvider(_script).start()
    try:
        with ModelProxy(sim.upstreams(), env={}) as proxy:
            cap = SpendCap(0.05)
            evidence = run_trials(proxy, cap, workers=8)
    finally:
        sim.stop()
    metered = sum(e.cost_usd for e in evidence)
    calls = sum(e.upstream_calls for e in evidence)
    assert cap.spent == pytest.approx(metered) == pytest.approx(calls * PER_CALL)  # every call priced from its full usage
    assert cap.spent <= 0.05 + 1e-12 and cap.high_water <= 0.05 + 1e-12
    assert cap.spent > 0.025 and sum(e.refused_budget for e in evidence) >= 8 and cap.reserved < 1e-12


def test_cassette_hits_cost_nothing_under_the_cap(tmp_path: Path) -> None:
    sim = SimulatedProvider(_script).start()
    cache = ResponseCache(tmp_path / "cassette.jsonl", "record")
    try:
        with ModelProxy(sim.upstreams(), cache, env={}) as proxy:
            cap = SpendCap(1.0)
            for _ in range(2):  # the same trial twice: the second attempt is served from the cassette
                budget = TrialBudget.open(cap, 0.0)
                route = proxy.open_trial(trial(k=1), budget)
                with anthropic_client(route).messages.stream(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
                    s.get_final_message()
                evidence = proxy.close_trial(route)
                assert budget is not None and budget.close() == pytest.approx(evidence.cost_usd)
    finally:
        sim.stop()
    assert len(sim.requests) == 1 and evidence.cache_hits == 1 and cap.spent == pytest.approx(PER_CALL)


WORKER = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from plumbline_otel.replay.budget import SpendCap
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimulatedProvider
from replay.test_proxy_spend import _script, run_trials
sim = SimulatedProvider(_script).start()
with ModelProxy(sim.upstreams(), env={}) as proxy:
    cap = SpendCap(float(sys.argv[3]), journal=sys.argv[2])
    evidence = run_trials(proxy, cap, workers=4, prefix=sys.argv[4])
sim.stop()
print(json.dumps({"metered": sum(e.cost_usd for e in evidence), "high_water": cap.high_water}))
"""


@pytest.mark.slow
def test_two_processes_sharing_a_journal_stay_under_the_cap(tmp_path: Path) -> None:
    journal = tmp_path / "ledger.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), str(journal), "0.04", f"p{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(2)]
    reports = [json.loads(p.communicate(timeout=240)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    rows = [orjson.loads(line) for line in journal.read_bytes().splitlines()]
    settled = sum(r["usd"] for r in rows if r.get("spend") == "settle")
    assert settled == pytest.approx(sum(r["metered"] for r in reports))  # the journal holds exactly what the proxies metered
    assert settled <= 0.04 + 1e-12 and all(r["high_water"] <= 0.04 + 1e-12 for r in reports)
    assert settled > 0.02
    assert {r["pid"] for r in rows if r.get("spend") == "reserve"} == {p.pid for p in procs}
