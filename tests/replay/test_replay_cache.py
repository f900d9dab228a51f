"""The response cache: trial identity is part of the key, so k repeats are k samples, and reruns replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from plumbline_otel.replay import ResponseCache, SpendCap, TrialBudget, TrialIdentity, TrialScope, anthropic_client, cache_key
from plumbline_otel.replay.cache import http_module, request_content
from plumbline_otel.replay.scope import activate

MODEL = "claude-haiku-4-5"


class FakeModel:
    """A Messages API that answers every call differently (a sampling model), counting calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.module = http_module()

    def __call__(self, request: Any) -> Any:
        self.calls.append(json.loads(request.content))
        n = len(self.calls)
        return self.module.Response(200, json={
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "text", "text": f"answer {n}"}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1000, "output_tokens": 200}})

    def client(self) -> anthropic.Anthropic:
        return anthropic_client("http://127.0.0.1:9", api_key="test", max_retries=0,
                                inner_transport=self.module.MockTransport(self))


def identity(k: int, study: str = "s") -> TrialIdentity:
    return TrialIdentity(f"{study}/INV-1029/baseline/0-abc/k{k}", "baseline", "0-abc", study, k, "INV-1029")


def ask(client: anthropic.Anthropic, text: str = "Please pay INV-1029.", **extra: Any) -> str:
    response = client.messages.create(model=MODEL, max_tokens=300, messages=[{"role": "user", "content": text}], **extra)
    return response.content[0].text


def test_repeats_of_one_request_get_their_own_entries_and_a_rerun_gets_its_own_answer(tmp_path: Path) -> None:
    model, cache = FakeModel(), ResponseCache(tmp_path / "responses.jsonl")
    client = model.client()
    answers = {}
    for k in (0, 1):
        with activate(TrialScope(identity(k), cache=cache)):
            answers[k] = ask(client)
    assert answers == {0: "answer 1", 1: "answer 2"}  # two repeats, two samples: no faked consistency
    assert len(model.calls) == 2 and len(cache) == 2
    with activate(TrialScope(identity(1), cache=cache)) as scope:  # the same trial again: its recorded answer
        assert ask(client) == "answer 2"
    assert scope.cache_hits == 1 and len(model.calls) == 2


def test_the_file_replays_offline_and_a_miss_is_refused_not_sent(tmp_path: Path) -> None:
    model = FakeModel()
    with activate(TrialScope(identity(0), cache=ResponseCache(tmp_path / "r.jsonl"))):
        recorded = ask(model.client())
    offline = ResponseCache(tmp_path / "r.jsonl", mode="replay")  # a new process, no network
    client = model.client()
    with activate(TrialScope(identity(0), cache=offline)) as scope:
        assert ask(client) == recorded
    with activate(TrialScope(identity(5), cache=offline)) as scope:
        with pytest.raises(anthropic.APIStatusError):
            ask(client)
    assert scope.abort_reason and scope.abort_reason.startswith("offline: no recorded response for trial s/INV-1029/baseline/0-abc/k5")
    assert len(model.calls) == 1


def test_a_request_sent_twice_in_one_trial_is_two_entries(tmp_path: Path) -> None:
    model, cache = FakeModel(), ResponseCache(tmp_path / "r.jsonl")
    client = model.client()
    with activate(TrialScope(identity(0), cache=cache)):
        first, second = ask(client), ask(client)
    assert (first, second) == ("answer 1", "answer 2")
    with activate(TrialScope(identity(0), cache=cache)):  # a rerun replays both, in order
        assert (ask(client), ask(client)) == ("answer 1", "answer 2")
    assert len(model.calls) == 2


def test_key_parts() -> None:
    content = request_content("post", "/v1/messages", {"model": MODEL, "tools": [{"name": "b"}, {"name": "a"}]})
    assert content["body"] == {"model": MODEL, "tools": [{"name": "a"}, {"name": "b"}]}  # tool order is not part of the key
    base = cache_key(identity(0), content)
    assert base != cache_key(identity(1), content)
    assert base != cache_key(TrialIdentity(identity(0).trial_id, "distractor", "0-abc", "s", 0), content)
    assert base != cache_key(identity(0), content, occurrence=1)
    assert base == cache_key(identity(0), request_content("POST", "/v1/messages", {"tools": [{"name": "a"}, {"name": "b"}], "model": MODEL}))


def test_live_calls_are_metered_against_the_trial_budget_and_refused_at_the_cap(tmp_path: Path) -> None:
    model = FakeModel()
    client = model.client()
    cap = SpendCap(0.005)  # haiku: 1000 in + 200 out = $0.002 per call
    budget = TrialBudget.open(cap, 0.0)
    with activate(TrialScope(identity(0), budget=budget, cache=None)) as scope:
        ask(client, "one")
        ask(client, "two")
        with pytest.raises(anthropic.APIStatusError):  # its upper-bound estimate does not fit what is left
            ask(client, "three")
    assert scope.abort_reason and scope.abort_reason.startswith("budget:")
    assert budget is not None
    budget.close()
    assert len(model.calls) == 2 and cap.spent == pytest.approx(0.004) and cap.high_water <= 0.005


def test_outside_a_trial_the_client_is_a_plain_client() -> None:
    model = FakeModel()
    client = model.client()
    assert [ask(client), ask(client)] == ["answer 1", "answer 2"]


def test_a_model_paraphraser_is_cached_per_study_guarded_and_paid_from_the_cap(tmp_path: Path) -> None:
    from plumbline_otel.replay import AnthropicParaphraser, PerturbOptions, StudyConfig, open_study

    from .toy import one_task

    module = http_module()
    calls: list[dict[str, Any]] = []

    def paraphrasing_model(request: Any) -> Any:
        calls.append(json.loads(request.content))
        rewordings = ["Kindly settle INV-1029 (4,820.00 GBP) by 2026-03-01 for Acme Ltd.",
                      "Pay INV-1029 for 4,280.00 GBP by 2026-03-01.",  # a changed amount: the guard rejects it
                      "Could you pay Acme Ltd invoice INV-1029, GBP 4,820.00, by 1 March 2026?"]
        return module.Response(200, json={
            "id": "msg", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 100},
            "content": [{"type": "text", "text": "```json\n" + json.dumps(rewordings) + "\n```"}]})

    client = anthropic_client("http://127.0.0.1:9", api_key="test", max_retries=0,
                              inner_transport=module.MockTransport(paraphrasing_model))
    config = StudyConfig("para", perturbations=("paraphrase",), budget_usd=1.0, state_dir=tmp_path / "state",
                         options=PerturbOptions(variants=3, paraphraser=AnthropicParaphraser(client, MODEL)))
    first = open_study(config, [one_task()], lambda trial: None)
    assert [v.rejected is None for v in first.plan.variants] == [True, False, True]
    assert "amount 4820" in (first.plan.rejected[0].rejected or "")
    assert first.cap.spent == pytest.approx((100 * 1 + 100 * 5) / 1e6)  # the paraphrase call was paid from the cap
    again = open_study(config, [one_task()], lambda trial: None)  # resume / re-plan: same variants, no new call
    assert [v.as_dict() for v in again.plan.variants] == [v.as_dict() for v in first.plan.variants]
    assert len(calls) == 1


def test_streamed_calls_are_metered_from_full_usage_and_recorded(tmp_path: Path) -> None:
    """The in-process client meters a stream too, cache tokens included, and replays it from the cassette."""
    module = http_module()
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "model": MODEL, "content": [],
                                              "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 1000, "output_tokens": 1, "cache_read_input_tokens": 5000,
                                                        "cache_creation_input_tokens": 2000}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "paid"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 200}},
        {"type": "message_stop"},
    ]
    sse = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    calls = []

    def streaming_model(request: Any) -> Any:
        calls.append(1)
        return module.Response(200, headers={"content-type": "text/event-stream"}, content=sse)

    client = anthropic_client("http://127.0.0.1:9", api_key="test", max_retries=0, inner_transport=module.MockTransport(streaming_model))
    cap, cache = SpendCap(1.0), ResponseCache(tmp_path / "responses.jsonl")
    for _ in range(2):
        budget = TrialBudget.open(cap, 0.0)
        with activate(TrialScope(identity(0), budget=budget, cache=cache)):
            with client.messages.stream(model=MODEL, max_tokens=300, messages=[{"role": "user", "content": "pay"}]) as stream:
                final: Any = stream.get_final_message()
                assert final.content[0].text == "paid"
        assert budget is not None
        budget.close()
    assert len(calls) == 1 and len(cache) == 1  # the second attempt replayed the recorded stream
    assert cap.spent == pytest.approx((1000 * 1.0 + 200 * 5.0 + 5000 * 0.10 + 2000 * 1.25) / 1e6)


def _sse_client(chunks: list[bytes]) -> Any:
    """A plain HTTP client through the metering transport, against a stand-in that streams `chunks` (simulated)."""
    from plumbline_otel.replay.cache import caching_transport

    module = http_module()

    def streaming(request: Any) -> Any:
        return module.Response(200, headers={"content-type": "text/event-stream"}, content=iter(list(chunks)))

    return module.Client(transport=caching_transport(module.MockTransport(streaming), module), base_url="http://127.0.0.1:9")


CHAT = {"model": MODEL, "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "pay INV-1029"}]}


def test_a_stream_whose_usage_never_came_is_charged_an_estimate_never_zero_metered() -> None:
    # A Chat Completions stream without stream_options.include_usage: no usage event at all.
    client = _sse_client([b'data: {"choices":[{"delta":{"content":"paid"}}]}\n\n', b"data: [DONE]\n\n"])
    budget = TrialBudget.open(SpendCap(1.0), 0.0)
    assert budget is not None
    with activate(TrialScope(identity(0), budget=budget)), client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        response.read()
    assert budget.used > 0 and budget.basis == "estimated"  # an upper bound from its text, labelled so
    assert budget.close() == pytest.approx(budget.used)


def test_a_stream_abandoned_part_way_is_metered_when_closed_not_left_to_the_garbage_collector() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}\n\n'
    client = _sse_client([b'data: {"choices":[{"delta":{"content":"pa"}}]}\n\n', b'data: {"choices":[{"delta":{"content":"id"}}]}\n\n',
                          usage, b"data: [DONE]\n\n"])
    budget = TrialBudget.open(SpendCap(1.0), 0.0)
    assert budget is not None
    with activate(TrialScope(identity(0), budget=budget)):
        with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
            next(response.iter_bytes())  # the agent stops reading here and moves on
        abandoned = budget.used
        with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
            response.read()  # read to its end: its own usage
    assert abandoned > 0 and budget.estimated == 1  # charged its estimate at close, before the next call
    assert budget.used > abandoned and budget.basis == "estimated"
