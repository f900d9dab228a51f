"""End to end on the reference domain: traffic → store → replay (AP adapter) → ingest → certificate.

The agents run on the SIMULATED model (a seeded policy behind the loopback Anthropic stand-in).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from waits import EVENT_DEADLINE_S

from domains.accounts_payable.replay_adapter import APAdapter
from domains.accounts_payable.run import run_domain
from domains.accounts_payable.tasks import TASKS
from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import Ledger, SpanSink, StudyConfig, run_study, select_tasks
from plumbline_otel.report import Certificate, build_certificate, load_certificate
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

from .toy import agent_runs

ARM = "plan_execute_retry"
AGENT = f"ap-agent-{ARM}"
SPEC = Path(__file__).resolve().parents[2] / "configs" / "accounts_payable.invariants.yaml"


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one arm's baseline runs of three invoices (the 'production traffic')."""
    root = tmp_path_factory.mktemp("traffic")
    run_domain(ARM, [t.task_id for t in TASKS[:3]], otlp_file=root / "src" / f"{ARM}.otlp.jsonl", offline=True,
               imperfections={}, study="traffic")
    with Store(root / "p.duckdb") as store:
        assert ingest_files(store, [str(root / "src")]).trajectories == 3
    return root


@pytest.fixture
def db(traffic: Path, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "p.duckdb"
    shutil.copy(traffic / "p.duckdb", path)
    yield path


def cells(cert: Certificate) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {(a.agent, c.perturbation): (c.n, c.missing, c.unexposed)
            for a in cert.agents for c in a.perturbations}


def test_replay_the_stored_tasks_and_certify_every_cell(db: Path, tmp_path: Path) -> None:
    with Store(db) as store:
        tasks = select_tasks(store, agent=AGENT)
    assert [t.task_key for t in tasks] == ["INV-1001", "INV-1002", "INV-1003"]
    adapter = APAdapter(ARM)
    config = StudyConfig("e2e", perturbations=("baseline", "distractor", "tool_fault"), repeats=2, concurrency=2,
                         sink=SpanSink(otlp_file=str(tmp_path / "replay.otlp.jsonl")), state_dir=tmp_path / "state")
    try:
        assert adapter.backend_kind == "simulated" and "SIMULATED" in adapter.describe()
        summary = run_study(config, tasks, adapter)
    finally:
        adapter.close()
        if config.sink is not None:
            config.sink.close()
    assert (summary.planned, summary.ok, summary.missing, summary.errored) == (18, 18, 0, 0)
    assert summary.faults() == (6, 6)
    assert summary.cache_recorded >= 18

    with Store(db) as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        replayed = agent_runs(store.trajectories(where="json_extract_string(doc, '$.context.\"plumbline.study\"') = 'e2e'"))
        cert = build_certificate(load_spec(SPEC), store.trajectories(), study="e2e", keys=summary.keys)
    label = f"{AGENT}@1.0.0"
    assert cells(cert) == {(label, "baseline"): (6, 0, 0), (label, "distractor"): (6, 0, 0), (label, "tool_fault"): (6, 0, 0)}
    assert cert.provenance.trials == 18
    by_trial = {t.context["plumbline.trial.id"]: t for t in replayed}
    records = {r.trial_id: r for r in summary.records}
    assert set(by_trial) == set(records)
    for trial_id, t in by_trial.items():
        assert t.trace_id == records[trial_id].trace_id and t.task_key == trial_id.split("/")[1]
        perturbation = t.context["plumbline.perturbation"]
        text = t.input or ""
        assert any(word in text for word in ("coffee", "printer", "umbrella", "lunch", "parking", "fire drill")) == (
            perturbation == "distractor")
        assert t.context.get("plumbline.fault.fired") is (True if perturbation == "tool_fault" else None)

    # Offline: the recorded responses alone replay the study; nothing reaches a model.
    offline_state = tmp_path / "offline"
    offline_state.mkdir()
    shutil.copy(tmp_path / "state" / "responses.jsonl", offline_state / "responses.jsonl")
    dead = APAdapter(ARM, model_url="http://127.0.0.1:9", model="simulated-ap-policy-v1")
    again_config = StudyConfig("e2e", perturbations=("baseline", "distractor", "tool_fault"), repeats=2, concurrency=2,
                               sink=SpanSink(otlp_file=str(tmp_path / "offline.otlp.jsonl")), state_dir=offline_state,
                               cache_mode="replay")
    try:
        again = run_study(again_config, tasks, dead)
    finally:
        dead.close()
        if again_config.sink is not None:
            again_config.sink.close()
    assert (again.ok, again.cache_hits, again.cache_recorded) == (18, summary.cache_recorded, 0)
    with Store(tmp_path / "offline.duckdb") as store:
        ingest_files(store, [str(tmp_path / "offline.otlp.jsonl")])
        offline_runs = {t.context["plumbline.trial.id"]: t for t in agent_runs(store.trajectories())}
    assert {tid: [(s.name, s.args, s.failed) for s in t.tool_steps] for tid, t in offline_runs.items()} == \
        {tid: [(s.name, s.args, s.failed) for s in t.tool_steps] for tid, t in by_trial.items()}


def test_the_cli_replays_resumes_and_says_what_to_run_next(db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.otlp.jsonl"
    args = ["replay", "--db", str(db), "--study", "cli", "--agent", AGENT, "--task", "INV-1001,INV-1003",
            "--perturbations", "baseline,paraphrase,tool_fault", "--repeats", "2",
            "--adapter", f"python:domains.accounts_payable.replay_adapter:{ARM}", "--otlp-file", str(out),
            "--concurrency", "2", "--spec", str(SPEC), "--state-dir", str(tmp_path / "state")]
    dry = runner.invoke(cli, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "12 trials, 0 variant(s) rejected" in dry.output and "SIMULATED" in dry.output
    assert not out.exists()

    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "ran 12 (12 ok, 0 missing, 0 errored), 0 skipped by resume; 0 variant(s) rejected" in result.output
    assert f"plumbline ingest {out} --db {db}" in result.output
    assert f"plumbline certify --spec {SPEC} --db {db} --study cli --agent {AGENT} --state {tmp_path / 'state'}" in result.output
    summary = json.loads((tmp_path / "state" / "summary.json").read_text())
    assert summary["ok"] == 12 and summary["faults_fired"] == summary["fault_trials"] == 4

    refused = runner.invoke(cli, args)
    assert refused.exit_code != 0 and "--resume" in str(refused.exception or refused.output)
    resumed = runner.invoke(cli, [*args, "--repeats", "3", "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert "ran 6 (6 ok, 0 missing, 0 errored), 12 skipped by resume" in resumed.output
    assert len(Ledger(tmp_path / "state" / "ledger.jsonl").decided()) == 18

    assert runner.invoke(cli, ["ingest", str(out), "--db", str(db), "--quiet"]).exit_code == 0
    cert_path = tmp_path / "cert.json"
    certified = runner.invoke(cli, ["certify", "--spec", str(SPEC), "--db", str(db), "--study", "cli",
                                    "--agent", AGENT, "--out", str(cert_path), "--format", "none"])
    unkeyed = load_certificate(cert_path)  # the state is not beside the store, and not named: no record is believed
    assert certified.exit_code == 0 and all(c.n == 0 for a in unkeyed.agents for c in a.perturbations)
    assert all("--state" in r.reason for r in unkeyed.provenance.untrusted_records or () if r.reason.startswith("unverified"))
    certified = runner.invoke(cli, ["certify", "--spec", str(SPEC), "--db", str(db), "--study", "cli", "--state", str(tmp_path / "state"),
                                    "--agent", AGENT, "--out", str(cert_path), "--format", "none"])
    assert certified.exit_code == 0, certified.output
    cert = load_certificate(cert_path)
    assert {p: n for (_, p), (n, _, _) in cells(cert).items()} == {"baseline": 6, "paraphrase": 6, "tool_fault": 6}


EXPORTING_AGENT = """
import json, os, sys
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

text = sys.stdin.read()
if not os.environ.get("AGENT_SILENT"):
    provider = TracerProvider(resource=Resource.create({"service.name": "cmd-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # the SDK reads OTEL_EXPORTER_OTLP_* as the driver set them
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ["TRACEPARENT"]})
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}])
    provider.get_tracer("cmd").start_span("invoke_agent cmd", context=parent, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.input.messages": messages}).end()
    provider.shutdown()
print(json.dumps({"output": "done"}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_replay_against_a_running_plumbline_serve(tmp_path: Path) -> None:
    """Tasks and resume state through the server's API; the trials' spans through its OTLP/HTTP port."""
    from domains.accounts_payable.run import run_domain
    from plumbline_otel.api.client import PlumblineClient

    grpc_port, http_port = _free_port(), _free_port()
    log = tmp_path / "serve.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "plumbline_otel.cli.serve", "--db", str(tmp_path / "served.duckdb"),
                                 "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--assemble-interval", "0.2"],
                                stdout=fh, stderr=fh)
    try:  # every wait below ends with its event (a ready line, runs in the store); the deadlines only bound a hang
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while "plumbline serve: OTLP" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{http_port}/v1/traces"
        run_domain(ARM, ["INV-1001", "INV-1002"], endpoint=endpoint, offline=True, study="traffic")

        def study_runs(study: str, n: int) -> list[dict]:
            with PlumblineClient(f"127.0.0.1:{grpc_port}") as client:
                while True:
                    docs = [d for d in client.trajectories() if d["context"].get("plumbline.study") == study
                            and "plumbline.record.kind" not in d["context"]]  # the agent's runs, not the driver's records
                    if len(docs) >= n or time.monotonic() > deadline:
                        return docs
                    time.sleep(0.2)

        deadline = time.monotonic() + EVENT_DEADLINE_S
        assert len(study_runs("traffic", 2)) == 2
        args = ["replay", "--server", f"127.0.0.1:{grpc_port}", "--study", "served", "--agent", AGENT,
                "--perturbations", "baseline,tool_fault", "--adapter", f"python:domains.accounts_payable.replay_adapter:{ARM}",
                "--endpoint", endpoint, "--state-dir", str(tmp_path / "state"), "--quiet"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert "ran 4 (4 ok, 0 missing, 0 errored)" in result.output
        deadline = time.monotonic() + EVENT_DEADLINE_S
        docs = study_runs("served", 4)
        assert sorted(d["context"]["plumbline.perturbation"] for d in docs) == ["baseline", "baseline", "tool_fault", "tool_fault"]
        # A fresh state directory holding only the study's identity and key (study.json): only the server knows these
        # trials ran, and resume believes its records, which that key verifies.
        (tmp_path / "fresh").mkdir()
        shutil.copy(tmp_path / "state" / "study.json", tmp_path / "fresh" / "study.json")
        again = CliRunner().invoke(cli, [*args[:-2], str(tmp_path / "fresh"), "--quiet", "--resume"])
        assert again.exit_code == 0, again.output
        assert "ran 0 (0 ok, 0 missing, 0 errored), 4 skipped by resume" in again.output

        # An agent in another process exports straight to the server: only the store can show
        # the driver its run, so --server confirms it there; a silent agent's trial is errored.
        script = tmp_path / "agent.py"
        script.write_text(EXPORTING_AGENT)
        # The driver waits for each trace until it is stored (the wait ends then), up to a deadline only a hang reaches.
        command = ["replay", "--server", f"127.0.0.1:{grpc_port}", "--agent", AGENT, "--endpoint", endpoint,
                   "--adapter", f"command:{sys.executable} {script}", "--quiet", "--trace-wait", str(EVENT_DEADLINE_S)]
        ran = CliRunner().invoke(cli, [*command, "--study", "cmd", "--state-dir", str(tmp_path / "cmd")])
        assert ran.exit_code == 0, ran.output
        assert "ran 2 (2 ok, 0 missing, 0 errored)" in ran.output
        silent = CliRunner().invoke(cli, [*command[:-1], "0.5", "--study", "mute", "--state-dir", str(tmp_path / "mute")],
                                    env={"AGENT_SILENT": "1"})
        assert silent.exit_code == 3 and "ran 2 (0 ok, 0 missing, 2 errored)" in silent.output
        assert "no trace received" in silent.output
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(EVENT_DEADLINE_S)
