"""The model check beside the rule guard, against a simulated, scripted client (no network, no key)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from plumbline_otel.replay.guard import GuardVerdict, ModelEquivalenceCheck, check_equivalent

REQUEST = "Please process invoice INV-1001 from Northwind Supplies."


@dataclass
class _Block:
    text: str


@dataclass
class _Response:
    content: list[_Block]


@dataclass
class ScriptedModelClient:
    """A simulated ``anthropic`` client: ``messages.create`` returns the scripted answers in turn."""

    answers: list[str | Exception]
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def messages(self) -> ScriptedModelClient:
        return self

    def create(self, **kwargs: Any) -> _Response:
        self.calls.append(kwargs)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return _Response([_Block(answer)])


def test_the_model_is_asked_only_when_the_rules_accept() -> None:
    client = ScriptedModelClient([])
    check = ModelEquivalenceCheck(client, "simulated-model")
    verdict = check_equivalent(REQUEST, "Please pay invoice INV-1001 from Northwind Supplies.", model=check)
    assert not verdict.ok and verdict.source == "rules" and client.calls == []


def test_the_model_accepts_a_paraphrase_the_rules_accepted() -> None:
    client = ScriptedModelClient(['{"equivalent": true, "changes": []}'])
    verdict = check_equivalent(REQUEST, "Kindly handle invoice INV-1001 from Northwind Supplies.",
                               model=ModelEquivalenceCheck(client, "simulated-model"))
    assert verdict == GuardVerdict(True, (), "model")
    [call] = client.calls
    assert call["model"] == "simulated-model" and "even if" in call["system"]
    assert json.loads(call["messages"][0]["content"]) == {
        "original": REQUEST, "rewrite": "Kindly handle invoice INV-1001 from Northwind Supplies."}


def test_the_model_can_reject_what_the_rules_let_through_and_says_why() -> None:
    client = ScriptedModelClient(['```json\n{"equivalent": false, "changes": ["adds a deadline"]}\n```'])
    verdict = check_equivalent(REQUEST, "Could you process invoice INV-1001 from Northwind Supplies?",
                               model=ModelEquivalenceCheck(client, "m"))
    assert not verdict.ok and verdict.source == "model" and verdict.reason == "model: adds a deadline"


def test_a_failed_or_unreadable_model_answer_rejects() -> None:
    variant = "Could you process invoice INV-1001 from Northwind Supplies?"
    failed = check_equivalent(REQUEST, variant, model=ModelEquivalenceCheck(
        ScriptedModelClient([TimeoutError("simulated timeout")]), "m"))
    assert not failed.ok and failed.reason == "model check failed: TimeoutError: simulated timeout"
    unreadable = check_equivalent(REQUEST, variant, model=ModelEquivalenceCheck(ScriptedModelClient(["yes, same"]), "m"))
    assert not unreadable.ok and (unreadable.reason or "").startswith("model check gave no verdict")
    no_bool = check_equivalent(REQUEST, variant, model=ModelEquivalenceCheck(
        ScriptedModelClient(['{"equivalent": "maybe"}']), "m"))
    assert not no_bool.ok and no_bool.source == "model"


def test_without_a_model_the_rules_decide_alone() -> None:
    assert check_equivalent(REQUEST, "Could you process invoice INV-1001 from Northwind Supplies?") == GuardVerdict(True)
