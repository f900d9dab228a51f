"""Branch-point replay end to end (issue 44) with an unmodified agent from tests/replay/agents through both proxies:
the OpenAI Agents SDK agent whose tools are on an MCP server (`openai_agents_mcp_ap`), its model the scripted
simulated provider and its tools the scripted tool server (`branch_tools_server.py`); both count what reached them.

* a prefix is served from a study's cassette with zero provider and zero tool-server calls;
* a production trace (the recorded framework fixture `mcp_openai_agents`, content captured) is taped from the stored
  run and replayed from step 3: the prefix served, the perturbation at 3, live after it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.store import Store

from .mcp_ap_support import AGENT, ROOT, SERVER, production_runs, production_store, simulated_provider

ENV = {"OPENAI_API_KEY": "sk-not-a-real-key", "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_BASE_URL": None}


provider = pytest.fixture(simulated_provider)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return production_store(tmp_path / "prod.duckdb")


def task_key(db: Path) -> str:
    (key,) = {t.task_key for t in production_runs(db)}
    assert key is not None
    return key


def replay(tmp_path: Path, db: Path, provider: Any, study: str, perturbations: str, *extra: str) -> tuple[Any, list[dict[str, Any]]]:
    """`plumbline replay` of the fixture's INV-1001 task; the tool server logs each call to <study>.tools.jsonl."""
    log = tmp_path / f"{study}.tools.jsonl"
    log.touch()
    spans = tmp_path / f"{study}.jsonl"
    result = CliRunner().invoke(cli, [
        "replay", "--db", str(db), "--study", study, "--agent", "plumbline-fixture-mcp-openai-agents", "--task", task_key(db),
        "--service", f"{study}-agent@1", "--adapter", AGENT, "--adapter-option", f"cwd={ROOT}", "--adapter-option", "timeout_s=120",
        "--perturbations", perturbations, "--proxy", "--upstream", f"openai={provider.openai_url}",
        "--mcp-upstream", f"{sys.executable} {SERVER} {log}", "--otlp-file", str(spans), "--concurrency", "1",
        "--trace-wait", "10", "--grace", "1", *extra], env=ENV)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result, [json.loads(line) for line in log.read_text().splitlines()]


def records(db: Path, spans: Path, study: str) -> list[Any]:
    """The driver's records of the study's attempts (ingested from its OTLP file), by perturbation."""
    from plumbline_otel.runs import is_record
    from plumbline_otel.trials import record_of

    assert CliRunner().invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code in (0, 3)
    with Store(db) as store:
        store.assemble()
        found = [record_of(t) for t in store.trajectories() if is_record(t)]
    out = [r for r in found if r is not None and r.study == study and r.attempt and r.status in ("ok", "errored", "missing")]
    return sorted(out, key=lambda r: (r.perturbation, r.attempt))


def state_dir(db: Path, study: str) -> Path:
    return Path(str(db.with_suffix("")) + ".replay") / study


@pytest.mark.slow
@pytest.mark.e2e
def test_a_prefix_is_served_from_the_cassette_with_no_provider_and_no_tool_server_call(tmp_path: Path, db: Path,
                                                                                        provider: Any) -> None:
    # The recorded run: the agent's baseline trial through both proxies (7 steps: 3 tool calls between 4 model calls).
    first, tools = replay(tmp_path, db, provider, "src", "baseline")
    assert "ran 1 (1 ok" in first.output, first.output
    assert [c["tool"] for c in tools] == ["lookup_invoice", "check_duplicate", "schedule_payment"]
    assert len(provider.requests) == 4

    # Branch at step 6 (the schedule_payment call) under tool_fault: steps 1-5 are the tape's (three model answers, two
    # tool results), the fault is the MCP proxy's own answer, and only step 7 (the agent's answer to the fault) is live.
    before = len(provider.requests)
    result, tools = replay(tmp_path, db, provider, "br", "tool_fault", "--branch-at", "6",
                           "--branch-from", str(state_dir(db, "src")), "--fault-tools", "schedule_payment")
    assert "branch-at: task" in result.output and "7 steps (4 model, 3 tool)" in result.output, result.output
    assert "ran 1 (1 ok" in result.output, result.output
    assert tools == []  # zero tool-server calls: the prefix's two from the tape, the faulted one never sent
    live = provider.requests[before:]
    assert len(live) == 1  # zero provider calls in the prefix: only the call after the branch point
    assert "the schedule_payment backend is temporarily unavailable" in orjson.dumps(live[0]["body"]).decode()  # the fault, as the agent saw it
    (record,) = records(db, tmp_path / "br.jsonl", "br")
    assert (record.perturbation, record.status, record.fault_fired, record.fault_source) == ("tool_fault@6", "ok", True, "mcp_proxy")
    assert record.evidence["model_proxy"]["tape_served"] == 3 and record.evidence["model_proxy"]["upstream_calls"] == 1
    assert record.evidence["mcp_proxy"]["tape_served"] == 2 and record.evidence["mcp_proxy"]["upstream_calls"] == 0

    # decoy_tools at step 3: the agent lists its tools before every model call; the decoys are listed only from step 3
    # on (a decoy in the prefix's requests would be a divergence at step 1), and the rest runs live.
    before = len(provider.requests)
    result, tools = replay(tmp_path, db, provider, "decoy", "decoy_tools", "--branch-at", "3", "--branch-from", str(state_dir(db, "src")))
    assert "ran 1 (1 ok" in result.output, result.output
    assert [c["tool"] for c in tools] == ["check_duplicate", "schedule_payment"]
    live = [[t.get("name") for t in r["body"]["tools"]] for r in provider.requests[before:]]
    assert len(live) == 3 and all(len(names) > 3 for names in live)  # every live request offered the decoys
    (record,) = records(db, tmp_path / "decoy.jsonl", "decoy")
    assert (record.perturbation, record.status, record.seen) == ("decoy_tools@3", "ok", True)
    assert record.evidence["model_proxy"]["tape_served"] == 1 and record.evidence["mcp_proxy"]["tape_served"] == 1


@pytest.mark.slow
@pytest.mark.e2e
def test_a_production_trace_is_replayed_from_step_3(tmp_path: Path, db: Path, provider: Any) -> None:
    """The stored run is the framework fixture's (recorded with content by the OpenAI Agents SDK over MCP): taped from
    the store, its step 1 (the model's lookup_invoice call) and step 2 (the lookup's result) are served, the model call
    at step 3 is faulted, and the agent runs on live: the provider and the tool server see only what comes after."""
    result, tools = replay(tmp_path, db, provider, "prod3", "model_fault", "--branch-at", "3")
    assert "7 steps (4 model, 3 tool)" in result.output, result.output
    assert "ran 1 (1 ok" in result.output, result.output
    assert [c["tool"] for c in tools] == ["check_duplicate", "schedule_payment"]  # lookup_invoice (step 2) came from the tape
    bodies = [orjson.dumps(r["body"]).decode() for r in provider.requests]
    assert len(bodies) == 3  # the agent's retry of the faulted call, then steps 5 and 7: never step 1
    assert all("Acme GmbH" in b and "4820.0" in b for b in bodies)  # the recorded lookup result reached the live model
    (record,) = records(db, tmp_path / "prod3.jsonl", "prod3")
    assert (record.perturbation, record.status, record.fault_fired, record.fault_source) == ("model_fault@3", "ok", True, "model_proxy")
    assert record.evidence["model_proxy"]["tape_served"] == 1 and record.evidence["mcp_proxy"]["tape_served"] == 1
    assert record.evidence["mcp_proxy"]["upstream_calls"] == 2
