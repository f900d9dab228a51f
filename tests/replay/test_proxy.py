"""The model-API proxy with the real openai and anthropic SDKs as clients and a simulated provider upstream:
the three APIs plain and streamed, exact metering (cache tokens and streams included), routing."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from plumbline_otel.replay.budget import SpendCap, TrialBudget
from plumbline_otel.replay.pricing import Usage, price
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider

from .proxy_helpers import ANTHROPIC_MODEL, LOOKUP, OPENAI_MODEL, anthropic_client, chat_tools, openai_client, responses_tools, trial


@pytest.fixture
def sim() -> Iterator[SimulatedProvider]:
    provider = SimulatedProvider(lambda api, body: SimReply(text="paid INV-1029", input_tokens=1000, output_tokens=50,
                                                            cache_read_tokens=4000, cache_write_tokens=2000 if api == "messages" else 0))
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture
def proxy(sim: SimulatedProvider) -> Iterator[ModelProxy]:
    with ModelProxy(sim.upstreams(), env={}) as p:
        yield p


def test_chat_plain_and_streamed_are_relayed_and_metered_exactly(proxy: ModelProxy, sim: SimulatedProvider) -> None:
    route = proxy.open_trial(trial())
    client = openai_client(route)
    plain = client.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "pay"}])
    assert plain.choices[0].message.content == "paid INV-1029"
    chunks = list(client.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "pay"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "paid INV-1029"
    assert all(c.usage is None for c in chunks)  # the usage chunk the proxy asked for is not shown to an agent that did not
    assert sim.requests[1]["body"]["stream_options"] == {"include_usage": True}
    evidence = proxy.close_trial(route)
    one = Usage(input_tokens=1000, output_tokens=50, cache_read_tokens=4000)
    assert evidence.calls == 2 and evidence.upstream_calls == 2
    assert evidence.usage == Usage(2000, 100, 8000, model=OPENAI_MODEL)
    assert evidence.cost_usd == pytest.approx(2 * price(OPENAI_MODEL, one))  # type: ignore[operator]
    assert evidence.cost_exact and evidence.unpriced_models == ()


def test_responses_plain_and_streamed(proxy: ModelProxy) -> None:
    route = proxy.open_trial(trial())
    client = openai_client(route)
    plain = client.responses.create(model=OPENAI_MODEL, input="pay INV-1029")
    assert plain.output_text == "paid INV-1029"
    events = list(client.responses.create(model=OPENAI_MODEL, input="pay INV-1029", stream=True))
    assert events[-1].type == "response.completed"
    evidence = proxy.close_trial(route)
    assert evidence.usage.cache_read_tokens == 8000 and evidence.usage.input_tokens == 2000 and evidence.usage.output_tokens == 100
    assert evidence.cost_usd == pytest.approx(2 * (1000 * 0.15 + 4000 * 0.075 + 50 * 0.60) / 1e6)


def test_messages_plain_and_streamed_price_cache_writes_and_reads(proxy: ModelProxy) -> None:
    route = proxy.open_trial(trial())
    client = anthropic_client(route)
    plain = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=100, messages=[{"role": "user", "content": "pay"}])
    assert plain.content[0].text == "paid INV-1029"  # type: ignore[union-attr]
    with client.messages.stream(model=ANTHROPIC_MODEL, max_tokens=100, messages=[{"role": "user", "content": "pay"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_creation_input_tokens == 2000
    evidence = proxy.close_trial(route)
    assert evidence.usage == Usage(2000, 100, 8000, 4000, model=ANTHROPIC_MODEL)
    # haiku 4.5: $1 input, $5 output, $0.10 cache read, $1.25 cache write, per million tokens
    assert evidence.cost_usd == pytest.approx(2 * (1000 * 1.0 + 50 * 5.0 + 4000 * 0.10 + 2000 * 1.25) / 1e6)


def test_budget_meters_each_call_and_refuses_past_the_cap_at_no_cost(proxy: ModelProxy) -> None:
    cap = SpendCap(0.01)
    budget = TrialBudget.open(cap, 0.0)
    assert budget is not None
    route = proxy.open_trial(trial(), budget)
    client = anthropic_client(route)
    client.messages.create(model=ANTHROPIC_MODEL, max_tokens=100, messages=[{"role": "user", "content": "pay"}])
    with pytest.raises(anthropic.RateLimitError, match="spend cap"):
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=4000, messages=[{"role": "user", "content": "pay"}])
    evidence = proxy.close_trial(route)
    assert evidence.refused_budget == 1 and evidence.upstream_calls == 1 and evidence.budget_stop
    assert budget.close() == pytest.approx(evidence.cost_usd)  # the refused call cost nothing
    assert cap.spent == pytest.approx((1000 * 1.0 + 50 * 5.0 + 4000 * 0.10 + 2000 * 1.25) / 1e6)


def test_an_unpriced_model_is_refused_under_a_cap_and_reported_without_one(proxy: ModelProxy) -> None:
    capped = TrialBudget.open(SpendCap(1.0), 0.0)
    route = proxy.open_trial(trial(0), capped)
    with pytest.raises(openai.RateLimitError, match="no price"):
        openai_client(route).chat.completions.create(model="mystery-1", messages=[{"role": "user", "content": "x"}])
    assert proxy.close_trial(route).upstream_calls == 0
    route = proxy.open_trial(trial(1), TrialBudget.open(SpendCap(None), 0.0))
    openai_client(route).chat.completions.create(model="mystery-1", messages=[{"role": "user", "content": "x"}])
    evidence = proxy.close_trial(route)
    assert evidence.cost_usd is None and evidence.unpriced_models == ("mystery-1",)


def test_unroutable_requests_are_refused_and_counted(proxy: ModelProxy) -> None:
    bare = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="matches no open trial"):
        bare.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}])
    route = proxy.open_trial(trial())
    proxy.close_trial(route)
    with pytest.raises(anthropic.PermissionDeniedError):  # a closed route is not reused
        anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert proxy.unroutable == 2


def test_baggage_and_traceparent_route_requests_on_the_bare_url(proxy: ModelProxy, sim: SimulatedProvider) -> None:
    t = trial(3, attempt=2)
    route = proxy.open_trial(t)
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "x"}]}
    by_baggage = httpx.post(f"{proxy.url}/v1/chat/completions", json=body,
                            headers={"baggage": f"plumbline.trial.id={t.trial_id.replace('/', '%2F')},plumbline.trial.attempt=2"})
    by_trace = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"traceparent": t.identity.traceparent()})
    wrong_attempt = httpx.post(f"{proxy.url}/v1/chat/completions", json=body,
                               headers={"baggage": f"plumbline.trial.id={t.trial_id},plumbline.trial.attempt=1"})
    assert (by_baggage.status_code, by_trace.status_code, wrong_attempt.status_code) == (200, 200, 403)
    assert proxy.close_trial(route).calls == 2


def test_the_proxy_listens_on_loopback_only() -> None:
    from plumbline_otel.errors import ConfigError

    with pytest.raises(ConfigError, match="loopback"):
        ModelProxy({}, host="0.0.0.0")


def test_the_proxy_key_replaces_the_agents_and_tools_reach_the_provider(sim: SimulatedProvider) -> None:
    with ModelProxy(sim.upstreams(), env={"OPENAI_API_KEY": "sk-proxy"}) as proxy:
        route = proxy.open_trial(trial())
        client = openai_client(route)
        client.responses.create(model=OPENAI_MODEL, input="pay", tools=responses_tools(LOOKUP))  # type: ignore[arg-type]
        client.chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}], tools=chat_tools(LOOKUP))  # type: ignore[arg-type]
        proxy.close_trial(route)
    assert {r["headers"].get("authorization") or r["headers"].get("Authorization") for r in sim.requests} == {"Bearer sk-proxy"}
    assert sim.requests[0]["path"] == "/v1/responses" and sim.requests[1]["path"] == "/v1/chat/completions"
