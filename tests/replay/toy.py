"""Helpers for the replay tests: a toy in-process agent that traces itself like a real one."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry import baggage
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from plumbline_otel.model import Trajectory
from plumbline_otel.replay import InjectedFault, ReplayTask, Trial, TrialOutcome, TrialSpanBuffer, inject_fault
from plumbline_otel.report import Certificate, load_certificate
from plumbline_otel.report.model import Cell
from plumbline_otel.runs import is_record
from plumbline_otel.trials import AttemptRecord, KeyRing, record_of, verify_record

REQUEST = "Please pay invoice INV-1029 for 4,820.00 GBP to Acme Ltd by 2026-03-01."


def one_task() -> ReplayTask:
    return ReplayTask("INV-1029", REQUEST, "src-1", "toy-agent", "1", 1, ("lookup_invoice", "pay"))


def tasks(n: int) -> list[ReplayTask]:
    return [ReplayTask(f"INV-{1000 + i}", f"Please pay invoice INV-{1000 + i} for {100 + i}.00 GBP.", f"src-{i}",
                       "toy-agent", "1", i, ("lookup_invoice", "pay")) for i in range(n)]


class ToyAgent:
    """An in-process agent: an ``invoke_agent`` root and one ``execute_tool`` span per tool call.

    It reads its trial identity from OTel baggage (as an instrumented agent would), calls
    ``inject_fault`` before each tool and retries a faulted call once, and exports its spans to
    the trial's sink, all or nothing.
    """

    service = "toy-agent"
    service_version = "1"
    honour_faults = True  # call inject_fault before each tool
    claim_fired = False  # say the fault fired, whatever happened
    redact = False  # record a failed tool's error as "Error details are redacted."

    def __init__(self, tools: tuple[str, ...] = ("lookup_invoice", "pay"), cost_usd: float | None = None, seconds: float = 0.0) -> None:
        self.tools = tools
        self.cost_usd = cost_usd
        self.seconds = seconds  # how long a run takes (`--adapter-option seconds=0.4`): a replay long enough to watch
        self.seen: list[dict[str, Any]] = []
        self._providers: dict[int, tuple[TracerProvider, TrialSpanBuffer]] = {}
        self._lock = threading.Lock()

    def _provider(self, trial: Trial) -> tuple[TracerProvider, TrialSpanBuffer]:
        with self._lock:
            key = id(trial.sink)
            if key not in self._providers:
                provider = TracerProvider(resource=Resource.create({"service.name": self.service, "service.version": self.service_version}))
                assert trial.sink is not None, "the toy agent exports through the study's sink"
                buffer = TrialSpanBuffer(trial.sink.exporter())
                provider.add_span_processor(buffer)
                self._providers[key] = (provider, buffer)
            return self._providers[key]

    def run(self, trial: Trial) -> TrialOutcome:
        time.sleep(self.seconds)
        provider, buffer = self._provider(trial)
        tracer = provider.get_tracer("toy")
        identity = {k: v for k, v in baggage.get_all().items() if k.startswith("plumbline.")}
        fired = False
        attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "toy",
                 "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": trial.text}]}]),
                 **{k: v for k, v in identity.items() if k != "plumbline.fault"}}
        with tracer.start_as_current_span("invoke_agent toy", attributes=attrs) as root:
            for tool in self.tools:
                for _attempt in range(2):
                    with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                            "gen_ai.tool.call.arguments": json.dumps({"invoice_id": trial.identity.task_key})}) as span:
                        try:
                            if self.honour_faults:
                                inject_fault(tool)
                        except InjectedFault as exc:
                            fired = True
                            span.set_attribute("error.type", exc.kind)
                            span.set_status(Status(StatusCode.ERROR, "Error details are redacted." if self.redact else str(exc)))
                            continue
                        span.set_attribute("gen_ai.tool.call.result", json.dumps({"ok": True}))
                        break
            fired = fired or self.claim_fired
            if trial.fault is not None:
                root.set_attribute("plumbline.fault.fired", fired)
            trace_id = format(root.get_span_context().trace_id, "032x")
        buffer.release(trace_id)
        self.seen.append({"trial_id": trial.trial_id, "baggage": identity, "trace_id": trace_id, "fired": fired})
        return TrialOutcome(trace_id=trace_id, cost_usd=self.cost_usd, fault_fired=fired if trial.fault else None)

    def close(self) -> None:
        for provider, _ in self._providers.values():
            provider.shutdown()


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def agent_runs(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """The agent's runs among stored trajectories (the driver's records set aside)."""
    return [t for t in trajectories if not is_record(t)]


def driver_records(trajectories: Iterable[Trajectory], keys: KeyRing) -> list[AttemptRecord]:
    """The driver's attempt records among stored trajectories (plans and seals set aside): those that verify under the study's key."""
    return [r for t in trajectories if (r := record_of(t)) is not None and r.attempt > 0 and r.status != "sealed"
            and verify_record(t, keys) == "verified"]


class CrashAfterExport(ToyAgent):
    """Exports a clean run of every trial, then raises."""

    def run(self, trial: Trial) -> TrialOutcome:
        super().run(trial)
        raise RuntimeError("the agent crashed after exporting its spans")


class ExitAfterExport(ToyAgent):
    """Exports a clean run, then calls sys.exit, as a script-style agent does."""

    def run(self, trial: Trial) -> TrialOutcome:
        super().run(trial)
        raise SystemExit(3)



class ClaimsFaults(ToyAgent):
    """Never lets the injector near its tools, yet says the fault fired: on its root span and to the driver."""

    honour_faults = False
    claim_fired = True


class RedactsErrors(ToyAgent):
    """Meets its fault honestly, but its framework redacts the tool error (the OpenAI Agents SDK's
    "Error details are redacted."), so the trace cannot show which failure it was."""

    redact = True


class DiesAfterExport(ToyAgent):
    """Exports a clean run of its INV-1000 trials, then kills its own interpreter (no exception to catch)."""

    def run(self, trial: Trial) -> TrialOutcome:
        outcome = super().run(trial)
        if trial.identity.task_key == "INV-1000":
            os._exit(1)
        return outcome


def traffic_store(tmp_path: Path, n: int = 2) -> Path:
    """A store holding the toy agent's clean traffic on `n` tasks: what a study takes its tasks from."""
    from plumbline_otel.ingest import ingest_files
    from plumbline_otel.replay import SpanSink, StudyConfig, run_study
    from plumbline_otel.store import Store
    from plumbline_otel.trials import states_beside

    path = tmp_path / "p.duckdb"
    sink = SpanSink(otlp_file=str(tmp_path / "traffic.jsonl"))  # its study state beside the store: certify finds its key
    run_study(StudyConfig("traffic", sink=sink, grace_s=0.0, state_dir=states_beside(path) / "traffic"), tasks(n), ToyAgent())
    sink.close()
    with Store(path) as store:
        ingest_files(store, [str(tmp_path / "traffic.jsonl")])
    return path


ROOT = Path(__file__).resolve().parents[2]
SPEC = """version: 1
name: toy
invariants:
  - {id: PAY, severity: critical, must_call: pay}
"""


def study(tmp_path: Path, db: Path, adapter: str, *extra: str, perturbations: str = "baseline", repeats: int = 2,
          name: str = "s", min_bound: float = 0.3) -> tuple[Any, Certificate, Any]:
    """replay → ingest → certify → gate through the CLI, as a user runs them: (replay result, certificate, gate result)."""
    from click.testing import CliRunner

    from plumbline_otel.cli.main import cli

    runner = CliRunner()
    spans = tmp_path / f"{name}.otlp.jsonl"
    replayed = runner.invoke(cli, ["replay", "--db", str(db), "--study", name, "--agent", "toy-agent", "--adapter", adapter,
                                   "--perturbations", perturbations, "--repeats", str(repeats), "--otlp-file", str(spans),
                                   "--trace-wait", "2", "--grace", "0.5", "--quiet", *extra])
    assert replayed.exception is None or isinstance(replayed.exception, SystemExit), replayed.output
    assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code in (0, 3)
    out = tmp_path / f"{name}.cert.json"
    certified = runner.invoke(cli, ["certify", "--spec", str(tmp_path / "spec.yaml"), "--db", str(db), "--study", name,
                                    "--out", str(out), "--format", "none"])
    assert certified.exit_code == 0, certified.output
    gate = runner.invoke(cli, ["gate", str(out), "--min-bound", str(min_bound)])
    return replayed, load_certificate(out), gate


def cell(cert: Certificate, perturbation: str = "baseline") -> Cell:
    return next(c for c in cert.cells if c.perturbation == perturbation)


class StandInProxy:
    """A stand-in (simulated) of a plumbline proxy for driver tests: it opens a route for each attempt and, when the
    attempt ends, reports `evidence` (what `ProxyEvidence`/`McpEvidence.as_dict()` would) as `witness`."""

    def __init__(self, witness: str, evidence: dict[str, Any]) -> None:
        self.witness, self.evidence = witness, evidence
        self.calls = int(evidence.get("calls") or 0)

    def open_trial(self, trial: Any, budget: Any) -> Any:
        return self

    def env(self) -> dict[str, str]:
        return {}

    def close_trial(self, route: Any) -> Any:
        return self

    def as_dict(self) -> dict[str, Any]:
        return dict(self.evidence)
