"""Branch-point replay of unmodified framework agents that run their own tools (issue 44): pydantic-ai and LangGraph
(Chat Completions), the OpenAI Agents SDK (Responses API) and a Node agent on the OpenAI JavaScript SDK from
tests/replay/agents, recorded through the model-API
proxy, then branched at every step from the study's cassette. Each framework builds its requests its own way (ids,
orderings, tool-result shapes); a prefix it replays faithfully must never be taken for a divergence, and each branch
point must be a cell of its own, its fault seen to reach the agent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from .frameworks_support import NODE_AGENT, replay


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("agent", ["pydantic_ai_ap", "langgraph_ap", "openai_agents_ap", "node"])
def test_a_framework_agent_is_branched_at_every_step_with_no_false_divergence(tmp_path: Path, db: Path, provider: Any,
                                                                               agent: str, request: pytest.FixtureRequest) -> None:
    if agent == "node":  # the OpenAI JavaScript SDK's loop (tests/replay/agents/node), skipped where Node is not installed
        request.getfixturevalue("node_agent_packages")
        adapter = f"command:node {NODE_AGENT / 'ap_agent.mjs'}"
    else:
        adapter = f"command:{sys.executable} -m tests.replay.agents.{agent}"
    first, _ = replay(tmp_path, db, provider, "src", adapter, "baseline")
    assert "ran 2 (2 ok" in first.output, first.output
    state = Path(str(db.with_suffix("")) + ".replay") / "src"
    before = len(provider.requests)
    result, cells = replay(tmp_path, db, provider, "each", adapter, "tool_result_fault,model_fault", "--branch-at", "each",
                           "--branch-from", str(state))
    assert "diverged" not in result.output, result.output
    assert "5 steps (3 model, 2 tool)" in result.output, result.output
    assert "ran 10 (10 ok, 0 missing, 0 errored)" in result.output, result.output
    assert sorted(cells) == ["model_fault@1", "model_fault@3", "model_fault@5", "tool_result_fault@2", "tool_result_fault@4"]
    for label, cell in cells.items():  # each point its own cell, both tasks scored, the perturbation seen by the proxy
        assert (cell["n"], cell["exposed"], cell["missing"]) == (2, 2, 0), (label, cell)
        assert cell["evidence_from"] == {"model_proxy": 2}, (label, cell)
    # The prefix came from the tape: per task, a branch at model step k sends the provider the calls from k on (the
    # faulted one is the proxy's answer; the agent's retry goes live), at tool step k those after it: 3 + 2 + 1 + 2 + 1.
    assert len(provider.requests) - before == 2 * 9
