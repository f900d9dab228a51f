"""A run's own `gen_ai.usage.cost.*` spans (issue 29 item 10) are the agent's word: the driver keeps their figure
beside its record and never settles a trial's cost on it, so an agent cannot lower what the cap charges it by what it
exports; a cost in another currency is not converted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import baggage

from plumbline_otel.replay import SpanSink, StudyConfig, Trial, TrialOutcome, run_study

from .toy import ToyAgent, tasks


class PricedAgent(ToyAgent):
    """Two model calls whose spans carry the cost the provider's responses reported (no plumbline meter saw them)."""

    def __init__(self, amount: float, currency: str = "USD", adapter_cost: float | None = None) -> None:
        super().__init__(tools=())
        self.amount, self.currency, self.adapter_cost = amount, currency, adapter_cost

    def run(self, trial: Trial) -> TrialOutcome:
        provider, buffer = self._provider(trial)
        tracer = provider.get_tracer("priced")
        identity = {k: str(v) for k, v in baggage.get_all().items() if k.startswith("plumbline.") and k != "plumbline.fault"}
        with tracer.start_as_current_span("invoke_agent priced", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.usage.cost.amount": 99.0,  # an agent's total: not a model call
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": trial.text}]}]),
                **identity}) as root:
            for _ in range(2):
                with tracer.start_as_current_span("chat m", attributes={
                        "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.cost.amount": self.amount,
                        "gen_ai.usage.cost.currency": self.currency, "gen_ai.usage.cost.source": "provider"}):
                    pass
            trace_id = format(root.get_span_context().trace_id, "032x")
        buffer.release(trace_id)
        return TrialOutcome(trace_id=trace_id, cost_usd=self.adapter_cost)


def _study(tmp_path: Path, agent: PricedAgent) -> tuple[list[str | None], list[float], list[float | None]]:
    """Each trial's cost basis, settled cost and the spans' reported figure, as the driver recorded them."""
    summary = run_study(StudyConfig("c", budget_usd=1.0, trial_max_usd=0.10, state_dir=tmp_path / "s", concurrency=1,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), tasks(2), agent)
    agent.close()
    assert summary.ok == 2
    return ([r.cost_basis for r in summary.records], [r.cost_usd for r in summary.records],
            [r.cost_reported_usd for r in summary.records])


def test_an_unmetered_trial_is_charged_its_reservation_whatever_its_spans_report(tmp_path: Path) -> None:
    basis, cost, reported = _study(tmp_path, PricedAgent(0.004))
    assert basis == ["reservation"] * 2 and cost == pytest.approx([0.10] * 2) and reported == pytest.approx([0.008] * 2)


def test_a_zero_cost_exported_by_the_agent_changes_nothing(tmp_path: Path) -> None:
    basis, cost, reported = _study(tmp_path, PricedAgent(0.0))
    assert basis == ["reservation"] * 2 and cost == pytest.approx([0.10] * 2) and reported == pytest.approx([0.0] * 2)


def test_the_adapters_report_never_lowers_the_reservation_and_the_spans_figure_is_kept_beside_it(tmp_path: Path) -> None:
    basis, cost, reported = _study(tmp_path, PricedAgent(0.004, adapter_cost=0.05))
    assert basis == ["reservation"] * 2 and cost == pytest.approx([0.10] * 2) and reported == pytest.approx([0.008] * 2)


def test_a_cost_in_another_currency_is_not_converted(tmp_path: Path) -> None:
    basis, cost, reported = _study(tmp_path, PricedAgent(0.004, currency="EUR"))
    assert basis == ["reservation"] * 2 and cost == pytest.approx([0.10] * 2) and reported == [None, None]
