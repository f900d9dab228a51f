"""Replay agents on real frameworks with no change to their code: the proxies perturb, fault, meter and witness.

The agents (tests/replay/agents/) are the OpenAI Agents SDK (Responses API), pydantic-ai and
LangGraph (Chat Completions), and the Agents SDK again with its tools on an MCP server. Their
provider is the **simulated** model (`replay.proxy.simulated`), reached only through
`plumbline replay --proxy`; none of them is traced, so their runs are what the proxies saw.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plumbline_otel.runs import is_record
from plumbline_otel.store import Store

from .frameworks_support import ENV, NODE_AGENT, ROOT, replay

WIRE = "baseline,decoy_tools,sampling,model_fault,tool_result_fault"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("agent", ["openai_agents_ap", "pydantic_ai_ap", "langgraph_ap"])
def test_a_framework_agent_is_replayed_under_every_wire_perturbation_with_no_code_change(tmp_path: Path, db: Path, provider: Any,
                                                                                       agent: str) -> None:
    result, cells = replay(tmp_path, db, provider, agent.replace("_", "-"), f"command:{sys.executable} -m tests.replay.agents.{agent}", WIRE)
    assert "ran 10 (10 ok, 0 missing, 0 errored)" in result.output, result.output
    assert set(cells) == set(WIRE.split(","))
    for name, c in cells.items():  # every trial scored, from the runs the proxy saw: both tools, in order
        assert (c["n"], c["conforming"], c["unexposed"], c["missing"]) == (2, 2, 0, 0), (name, c)
    # The perturbations that live on the wire were seen to reach the model by the proxy, and only there.
    for name in ("decoy_tools", "sampling", "model_fault", "tool_result_fault"):
        assert cells[name]["evidence_from"] == {"model_proxy": 2}, name
    assert cells["baseline"]["evidence_from"] == {}
    assert all(c["unmetered"] == 0 for c in cells.values())


@pytest.mark.slow
@pytest.mark.e2e
def test_an_mcp_tooled_agent_gets_its_tool_fault_from_the_mcp_proxy_and_an_unroutable_trial_is_missing(
        tmp_path: Path, db: Path, provider: Any) -> None:
    # The agent finds its tool server at AP_MCP_URL, its own setting: the adapter command points it at the proxy's route.
    agent = f"command:sh -c 'AP_MCP_URL=\"$PLUMBLINE_MCP_URL\" exec {sys.executable} -m tests.replay.agents.openai_agents_mcp_ap'"
    result, cells = replay(tmp_path, db, provider, "mcp", agent, "baseline,tool_fault,decoy_tools",
                           "--mcp-upstream", f"{sys.executable} -m tests.replay.agents.ap_mcp_server", "--fault-tools", "pay")
    assert "ran 6 (6 ok, 0 missing, 0 errored)" in result.output, result.output
    assert cells["tool_fault"]["evidence_from"] == {"mcp_proxy": 2} and cells["tool_fault"]["exposed"] == 2
    assert cells["decoy_tools"]["evidence_from"] in ({"model_proxy": 2}, {"mcp_proxy": 2})
    with Store(db) as store:
        runs = [t for t in store.trajectories() if t.context.get("plumbline.study") == "mcp" and not is_record(t)]
    # The MCP proxy's spans carry each tool call with its arguments and result; the model proxy's, each LLM call.
    assert all(any(s.kind == "tool_call" and s.name == "pay" and s.args == {"invoice_id": t.task_key} for s in t.steps)
               for t in runs if t.context.get("plumbline.perturbation") == "baseline")

    # An agent that ignores OPENAI_BASE_URL (its calls reach the bare proxy, with no route) cannot be witnessed: missing.
    bare = f"command:sh -c 'OPENAI_BASE_URL=\"${{OPENAI_BASE_URL%/t/*}}/v1\" exec {sys.executable} -m tests.replay.agents.pydantic_ai_ap'"
    lost, lost_cells = replay(tmp_path, db, provider, "lost", bare, "baseline")
    assert lost.exit_code == 3 and "unrouted: no model call reached this attempt's proxy route" in lost.output
    assert (lost_cells["baseline"]["n"], lost_cells["baseline"]["missing"]) == (0, 2)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_study_replays_offline_from_its_cassette_with_no_provider_call(tmp_path: Path, db: Path, provider: Any) -> None:
    """One command re-runs a decided study from its recording (`--cassette`), offline, and reproduces its certificate."""

    offline_db = tmp_path / "offline.duckdb"
    shutil.copy(db, offline_db)
    agent = f"command:{sys.executable} -m tests.replay.agents.pydantic_ai_ap"
    first, recorded = replay(tmp_path, db, provider, "tape", agent, "baseline,sampling")
    assert "ran 4 (4 ok" in first.output
    calls_before = len(provider.requests)

    class Dead:  # the provider is gone: only the cassette can answer
        openai_url = "http://127.0.0.1:9/v1"

    tape = db.with_suffix("").parent / "p.replay" / "tape"
    again, cells = replay(tmp_path, offline_db, Dead(), "tape-again", agent, "baseline,sampling", "--cassette", str(tape))
    assert "ran 4 (4 ok" in again.output, again.output
    assert len(provider.requests) == calls_before
    hits = int(again.output.split("cache: ")[1].split(" hits")[0])
    assert hits >= 4  # every model call of every trial answered from the cassette, and counted
    keep = ("n", "conforming", "exposed", "errored", "unexposed", "missing", "per_task")
    assert {p: {k: c[k] for k in keep} for p, c in cells.items()} == {p: {k: c[k] for k in keep} for p, c in recorded.items()}

    def steps(path: Path, study: str) -> dict[str, list[tuple[str, Any]]]:
        with Store(path) as store:
            return {str(t.context.get("plumbline.trial.id")).partition("/")[2]: [(s.name, s.args) for s in t.steps if s.kind == "tool_call"]
                    for t in store.trajectories() if t.context.get("plumbline.study") == study and not is_record(t)}

    assert steps(offline_db, "tape-again") == steps(db, "tape") and len(steps(db, "tape")) == 4


@pytest.mark.slow
def test_plumbline_proxy_meters_and_records_an_agent_outside_a_study(tmp_path: Path, provider: Any) -> None:
    import signal

    cassette = tmp_path / "tape.jsonl"
    # Served until Ctrl-C (SIGINT), sent once the agent is done: a `--seconds` window could end before a
    # loaded machine's agent connected (issue 42 item 5).
    proc = subprocess.Popen([sys.executable, "-m", "plumbline_otel.cli.main", "proxy", "--upstream", f"openai={provider.openai_url}",
                             "--cassette", str(cassette)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        base = next(line.split("=", 1)[1].strip() for line in lines if "OPENAI_BASE_URL=" in line)
        agent = subprocess.run([sys.executable, "-m", "tests.replay.agents.pydantic_ai_ap"], input="Please pay invoice INV-42.", cwd=ROOT,
                               capture_output=True, text=True, env={**os.environ, **{k: v for k, v in ENV.items() if v}, "OPENAI_BASE_URL": base},
                               timeout=600)
        assert agent.returncode == 0, agent.stderr
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "witnessed 3 model call(s): 3 to the provider, 0 from the cassette" in out
    assert len(cassette.read_text().splitlines()) == 3


@pytest.mark.slow
@pytest.mark.e2e
def test_a_node_agent_is_replayed_through_the_proxy_with_no_code_change(tmp_path: Path, db: Path, provider: Any,
                                                                         node_agent_packages: Path) -> None:
    result, cells = replay(tmp_path, db, provider, "node", f"command:node {NODE_AGENT / 'ap_agent.mjs'}",
                           "baseline,decoy_tools,sampling,model_fault,tool_result_fault")
    assert "ran 10 (10 ok, 0 missing, 0 errored)" in result.output, result.output
    assert all((c["n"], c["conforming"]) == (2, 2) for c in cells.values())
    assert all(cells[p]["evidence_from"] == {"model_proxy": 2} for p in ("decoy_tools", "sampling", "model_fault", "tool_result_fault"))
