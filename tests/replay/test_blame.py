"""Plumbline's own refusals and failures are never the agent's: through the model-API proxy, a cassette miss, a spend-cap
refusal and a provider that is down make the trial missing with that cause (retried where a retry can help); the agent
that failed on its own, beside them, is errored. The agent is a plain OpenAI SDK loop that exits non-zero when a call
fails, as a real one does; the provider is the simulated stand-in."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from plumbline_otel.replay import ResponseCache, RetryPolicy, SpanSink, StudyConfig, Trial, TrialOutcome, run_study
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider

from .proxy_helpers import OPENAI_MODEL
from .toy import StandInProxy, tasks


@pytest.fixture
def sim() -> Iterator[SimulatedProvider]:
    provider = SimulatedProvider(lambda api, body: SimReply(text="paid", input_tokens=1000, output_tokens=50))
    provider.start()
    yield provider
    provider.stop()


def agent(fails_by_itself: bool = False) -> Any:
    """One model call through the attempt's route; any failure ends the run with an error (the SDK raised)."""
    def run(trial: Trial) -> TrialOutcome:
        client = openai.OpenAI(base_url=trial.routes["OPENAI_BASE_URL"], api_key="agent-key", max_retries=0)
        answer = client.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": trial.text}])
        if fails_by_itself:
            raise RuntimeError("the agent's own bug")
        return TrialOutcome(output=answer.choices[0].message.content)
    return run


def study(tmp_path: Path, proxy: ModelProxy, run: Any, **kw: Any) -> Any:
    config = StudyConfig("b", sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl")), state_dir=tmp_path / "state", proxies=[proxy],
                         grace_s=0.0, concurrency=1, retry=RetryPolicy(max_attempts=2, base_delay_s=0.01), **kw)
    return run_study(config, tasks(2), run)


def statuses(summary: Any) -> list[tuple[str, str]]:
    return [(r.status, (r.reason or "").split(":")[0]) for r in summary.records]


def test_an_agent_that_fails_by_itself_is_errored(tmp_path: Path, sim: SimulatedProvider) -> None:
    with ModelProxy(sim.upstreams(), env={}) as proxy:
        summary = study(tmp_path, proxy, agent(fails_by_itself=True))
    assert statuses(summary) == [("errored", "RuntimeError")] * 2


def test_a_cassette_miss_is_missing_not_the_agent_s_error(tmp_path: Path, sim: SimulatedProvider) -> None:
    cassette = ResponseCache(tmp_path / "empty.jsonl", "replay")  # offline, and nothing recorded
    with ModelProxy(sim.upstreams(), cassette, env={}) as proxy:
        summary = study(tmp_path, proxy, agent(), cache_mode="replay")
    assert statuses(summary) == [("missing", "cassette miss")] * 2
    assert all(r.attempts == 1 for r in summary.records)  # a miss is final: running again misses again
    assert not sim.requests


def test_a_spend_cap_refusal_at_the_proxy_is_missing_not_the_agent_s_error(tmp_path: Path, sim: SimulatedProvider) -> None:
    with ModelProxy(sim.upstreams(), env={}) as proxy:
        summary = study(tmp_path, proxy, agent(), budget_usd=0.00001, trial_max_usd=0.000001)
    assert [s for s, _ in statuses(summary)] == ["missing", "missing"]
    assert any(r.reason and r.reason.startswith("plumbline refused") for r in summary.records)
    assert summary.errored == 0


def test_a_provider_that_is_down_is_missing_retried_and_named(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    with ModelProxy({"openai": f"{down}/v1", "anthropic": down}, env={}) as proxy:
        summary = study(tmp_path, proxy, agent())
    assert statuses(summary) == [("missing", "provider failed")] * 2
    assert all(r.attempts == 2 for r in summary.records)  # retried within the study's retry budget
    assert summary.errored == 0


def test_a_tool_server_that_died_is_missing_with_that_cause_never_the_agent_s_error(tmp_path: Path) -> None:
    def fails(trial: Trial) -> TrialOutcome:  # the agent's tool call failed, so it exits non-zero
        raise RuntimeError("tool pay failed")

    # the MCP proxy's stdio tool server died during the attempt's second call (as tests/replay/test_mcp_proxy_failures.py
    # shows the real proxy saying)
    died = StandInProxy("mcp_proxy", {"calls": 2, "server_died": [{"call": 2, "tool": "pay", "kind": "died", "relaunched": True,
                                                                    "detail": "the stdio server exited with code 1"}]})
    config = StudyConfig("t", sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl")), proxies=[died], grace_s=0.0,
                         trace_wait_s=0.05, retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
    summary = run_study(config, tasks(2), fails)
    assert [(r.status, r.attempts) for r in summary.records] == [("missing", 2)] * 2  # retried: the server is relaunched
    assert all(r.reason and r.reason.startswith("tool server died: the stdio server exited") for r in summary.records)
    assert all("agent's own result: errored: RuntimeError" in (r.reason or "") for r in summary.records)
