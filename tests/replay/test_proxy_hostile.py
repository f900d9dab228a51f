"""The model-API proxy against providers and agents that misbehave (issue 39 items 11, 12 and the evidence
of items 1-2): a provider that is down, answers 500 or 429, sends garbage or invalid UTF-8, hangs, cuts
a stream, never ends one, or answers far too much; requests that are malformed or too large; the
proxy failing itself. Each case asserts what the agent got and what the evidence says, so the driver
can tell the provider's failure and the proxy's own from the agent's."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.limits import MIB, ProxyLimits
from plumbline_otel.replay.proxy import ModelProxy, ProxyRoute
from plumbline_otel.replay.proxy import exchange as exchange_module

from .hostile import (
    Hostile,
    answer,
    chat_body,
    chat_event,
    endless_stream,
    hang,
    huge_answer,
    reset,
    stream_then_cut,
)
from .proxy_helpers import OPENAI_MODEL, anthropic_client, openai_client, trial

MESSAGES: Any = [{"role": "user", "content": "pay INV-1029"}]  # the SDKs' TypedDicts


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    provider = Hostile().start()
    yield provider
    provider.stop()


def proxy_for(provider: Hostile, tmp_path: Path | None = None, **kwargs: object) -> ModelProxy:
    cache = ResponseCache(tmp_path / "responses.jsonl", "record") if tmp_path is not None else None
    return ModelProxy(provider.upstreams(), cache, env={}, **kwargs)  # type: ignore[arg-type]


def raw_call(route: ProxyRoute, payload: bytes, extra: bytes = b"", timeout: float = EVENT_DEADLINE_S, read: int | None = None) -> bytes:
    """POST ``payload`` on a raw socket and read until the proxy closes (or ``read`` bytes): every byte it sent, framing included."""
    host, port = route.proxy_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        head = (f"POST /t/{route.token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\nconnection: close\r\n").encode()
        sock.sendall(head + extra + b"\r\n" + payload)
        data = b""
        while read is None or len(data) < read:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


# --- the provider fails (provider_failures) ------------------------------------------------------


def test_a_provider_that_is_down_is_a_provider_failure_not_the_agents() -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: connection refused
    with ModelProxy({"openai": f"http://127.0.0.1:{port}/v1"}, env={}) as proxy:
        route = proxy.open_trial(trial())
        with pytest.raises(openai.InternalServerError) as raised:
            openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        evidence = proxy.close_trial(route)
    assert raised.value.status_code == 502 and "ConnectError" in str(raised.value)
    (failure,) = evidence.provider_failures
    assert failure["call"] == 1 and failure["status"] == 502 and failure["kind"] == "unreachable" and not failure["recovered"]
    assert evidence.proxy_errors == () and evidence.faults == () and evidence.cost_usd == 0
    assert evidence.as_dict()["provider_failures"] == [failure] and evidence.as_dict()["proxy_errors"] == []


def test_a_500_and_a_reset_are_provider_failures_and_a_429_then_success_is_recovered(hostile: Hostile) -> None:
    hostile.script = [answer(500, b'{"error": {"message": "upstream boom"}}'), reset,
                      answer(429, b'{"error": {"message": "slow down"}}'), answer(200, chat_body())]
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial())
        client = openai_client(route)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        assert client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES).choices[0].message.content == "paid"
        evidence = proxy.close_trial(route)
    kinds = [(f["call"], f["status"], f["kind"], f["recovered"]) for f in evidence.provider_failures]
    assert kinds == [(1, 500, "status", True), (2, 502, "transport", True), (3, 429, "rate_limited", True)]
    assert "upstream boom" in evidence.provider_failures[0]["detail"]
    assert evidence.proxy_errors == () and evidence.upstream_calls == 4 and evidence.cost_usd > 0


def test_garbage_and_invalid_utf8_are_failures_recorded_as_bytes_and_replayed_bit_for_bit(hostile: Hostile, tmp_path: Path) -> None:
    garbage = b"\xff\xfe<html>not \xc3\x28 an API answer"
    hostile.behave = answer(200, garbage)
    with proxy_for(hostile, tmp_path) as proxy:
        route = proxy.open_trial(trial())
        with pytest.raises((openai.APIError, ValueError)):  # the SDK cannot parse it
            openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        evidence = proxy.close_trial(route)
    (failure,) = evidence.provider_failures
    assert failure["kind"] == "garbage" and failure["status"] == 200 and "undecodable" in failure["detail"]
    assert evidence.proxy_errors == () and not evidence.cost_exact and evidence.cost_usd > 0
    (line,) = [json.loads(raw) for raw in (tmp_path / "responses.jsonl").read_text().splitlines()]
    assert line["body_encoding"] == "base64" and base64.b64decode(line["body"]) == garbage
    # offline, the cassette answers the same bytes (and the same failure is seen), with no provider call
    before = len(hostile.requests)
    with ModelProxy(hostile.upstreams(), ResponseCache(tmp_path / "responses.jsonl", "replay"), env={}) as offline:
        route = offline.open_trial(trial())
        assert raw_call(route, orjson.dumps({"model": OPENAI_MODEL, "messages": MESSAGES})).endswith(garbage)
        replayed = offline.close_trial(route)
    assert len(hostile.requests) == before and replayed.cache_hits == 1
    assert [f["kind"] for f in replayed.provider_failures] == ["garbage"]


def test_a_provider_that_hangs_is_given_up_on_after_the_read_timeout(hostile: Hostile) -> None:
    hostile.behave = hang
    with proxy_for(hostile, timeout_s=1.0) as proxy:
        route = proxy.open_trial(trial())
        with pytest.raises(openai.APIStatusError) as raised:
            openai_client(route, timeout=60).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        evidence = proxy.close_trial(route)
    assert raised.value.status_code == 504
    (failure,) = evidence.provider_failures
    assert failure["kind"] == "timeout" and failure["status"] == 504 and evidence.proxy_errors == ()


# --- a stream cut by the provider (item 12) --------------------------------------------------------


def test_a_stream_the_provider_cuts_ends_as_an_interrupted_stream_is_metered_and_recorded(hostile: Hostile, tmp_path: Path) -> None:
    events = [chat_event("paid "), chat_event("INV-")]
    hostile.behave = stream_then_cut(events, tail=b'data: {"id": "chatcm')
    with proxy_for(hostile, tmp_path) as proxy:
        route = proxy.open_trial(trial())
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):  # what the SDK raises when the provider itself drops a stream
            for chunk in openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True):
                received.append(chunk.choices[0].delta.content or "")
        assert received == ["paid ", "INV-"]
        wire = raw_call(route, orjson.dumps({"model": OPENAI_MODEL, "messages": MESSAGES, "stream": True}))
        evidence = proxy.close_trial(route)
    # one status line, the events relayed, no chunked terminator, and the connection closed (raw_call returned)
    assert wire.count(b"HTTP/1.1 ") == 1 and wire.startswith(b"HTTP/1.1 200") and b"502" not in wire
    assert b"paid " in wire and not wire.endswith(b"0\r\n\r\n")
    assert [(f["call"], f["status"], f["kind"]) for f in evidence.provider_failures] == [(1, 200, "stream_cut"), (2, 200, "stream_cut")]
    assert "RemoteProtocolError" in evidence.provider_failures[0]["detail"]
    # metered for what was received: never $0, marked inexact
    assert evidence.cost_usd is not None and evidence.cost_usd > 0 and not evidence.cost_exact
    assert all(e["incomplete"] and e["cost_usd"] > 0 for e in evidence.exchanges)
    lines = [json.loads(raw) for raw in (tmp_path / "responses.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["incomplete"] for line in lines) and "paid " in lines[0]["body"]
    # offline, the recorded stream is replayed and cut at the same place
    with ModelProxy(hostile.upstreams(), ResponseCache(tmp_path / "responses.jsonl", "replay"), env={}) as offline:
        route = offline.open_trial(trial())
        again: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for chunk in openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True):
                again.append(chunk.choices[0].delta.content or "")
        offline.close_trial(route)
    assert again == received


def test_an_anthropic_stream_cut_after_message_start_is_charged_its_input(hostile: Hostile) -> None:
    start = {"type": "message_start", "message": {"id": "msg_h", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                                                  "content": [], "stop_reason": None,
                                                  "usage": {"input_tokens": 5000, "output_tokens": 1}}}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "paid INV"}}
    events = [f"event: {e['type']}\ndata: ".encode() + orjson.dumps(e) + b"\n\n" for e in (start, block, delta)]
    hostile.behave = stream_then_cut(events)
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial())
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whichever error the SDK makes of a dropped stream
            with anthropic_client(route).messages.stream(model="claude-haiku-4-5", max_tokens=100, messages=MESSAGES) as stream:
                stream.get_final_message()
        evidence = proxy.close_trial(route)
    assert "status" not in type(raised.value).__name__.lower()  # not an HTTP status error: the stream broke
    assert [f["kind"] for f in evidence.provider_failures] == ["stream_cut"]
    # haiku 4.5: $1 input, $5 output per million: 5000 input tokens and 8 characters of output received
    assert evidence.cost_usd == pytest.approx((5000 * 1.0 + 8 * 5.0) / 1e6) and not evidence.cost_exact


def test_an_injected_stream_cut_is_a_fault_never_a_provider_failure(hostile: Hostile) -> None:
    hostile.behave = stream_then_cut([chat_event("a"), chat_event("b"), chat_event("c"), b"data: [DONE]\n\n"])
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial(perturbation="model_fault", model_fault={"kind": "stream_cut", "on_call": 1, "after_events": 1}))
        with pytest.raises(openai.APIConnectionError):
            list(openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True))
        evidence = proxy.close_trial(route)
    assert [f["kind"] for f in evidence.faults] == ["stream_cut"]
    assert [f["kind"] for f in evidence.provider_failures] == ["stream_cut"]  # the provider also dropped it after [DONE] with no terminator


# --- bounded memory (item 11) -------------------------------------------------------------------------


def test_an_endless_stream_is_no_longer_read_once_the_agent_hangs_up(hostile: Hostile) -> None:
    hostile.behave = endless_stream()
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial())
        first = raw_call(route, orjson.dumps({"model": OPENAI_MODEL, "messages": MESSAGES, "stream": True}), read=256 << 10)
        assert first.startswith(b"HTTP/1.1 200")  # the agent read a little of it and hung up
        assert hostile.wait_finished(1, timeout=EVENT_DEADLINE_S), "the proxy kept reading the provider after the agent left"
        evidence = proxy.close_trial(route, wait_s=EVENT_DEADLINE_S)
    assert evidence.provider_failures == () and evidence.proxy_errors == ()
    (exchange,) = evidence.exchanges
    assert exchange["incomplete"] and exchange["cost_usd"] > 0


def test_an_endless_stream_the_agent_keeps_reading_is_cut_at_the_response_limit(hostile: Hostile) -> None:
    hostile.behave = endless_stream()
    with proxy_for(hostile, limits=ProxyLimits(max_response_bytes=2 * MIB)) as proxy:
        route = proxy.open_trial(trial())
        wire = raw_call(route, orjson.dumps({"model": OPENAI_MODEL, "messages": MESSAGES, "stream": True}))
        evidence = proxy.close_trial(route)
    assert wire.count(b"HTTP/1.1 ") == 1 and 1 * MIB < len(wire) < 3 * MIB and not wire.endswith(b"0\r\n\r\n")
    (failure,) = evidence.provider_failures
    assert failure["kind"] == "too_large" and "limit" in failure["detail"]


@pytest.mark.parametrize("declare", [True, False])
def test_a_whole_answer_past_the_limit_is_refused_with_a_clear_error(hostile: Hostile, declare: bool) -> None:
    hostile.behave = huge_answer(8 * MIB, declare=declare)
    with proxy_for(hostile, limits=ProxyLimits(max_response_bytes=1 * MIB)) as proxy:
        route = proxy.open_trial(trial())
        with pytest.raises(openai.APIStatusError) as raised:
            openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        evidence = proxy.close_trial(route)
    assert raised.value.status_code == 502 and "limit of 1048576" in str(raised.value)
    assert [f["kind"] for f in evidence.provider_failures] == ["too_large"]
    assert hostile.sent_bytes < 8 * MIB or declare  # undeclared: the proxy stopped reading at the limit


@pytest.mark.parametrize(("extra", "status", "words"), [
    (b"content-length: abc\r\n", 400, "Content-Length"),
    (b"content-length: -5\r\n", 400, "Content-Length"),
    (b"transfer-encoding: chunked\r\n", 400, "chunk size"),
    (b"transfer-encoding: gzip\r\n", 400, "Transfer-Encoding"),
])
def test_malformed_requests_get_a_clear_400_and_the_proxy_serves_on(hostile: Hostile, extra: bytes, status: int, words: str) -> None:
    hostile.behave = answer(200, chat_body())
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial())
        host, port = route.proxy_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=EVENT_DEADLINE_S) as sock:
            sock.sendall(f"POST /t/{route.token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n".encode() + extra
                         + b"\r\nzz-not-hex\r\n{}\r\n0\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.startswith(f"HTTP/1.1 {status}".encode()) and words.encode() in data
        assert b"Traceback" not in data
        assert openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES).choices[0].message.content == "paid"
        evidence = proxy.close_trial(route)
    assert [e["kind"] for e in evidence.proxy_errors] == ["bad_request_framing"] and evidence.provider_failures == ()


def test_a_request_body_past_the_limit_is_refused_unread(hostile: Hostile) -> None:
    hostile.behave = answer(200, chat_body())
    with proxy_for(hostile, limits=ProxyLimits(max_request_bytes=1 * MIB)) as proxy:
        route = proxy.open_trial(trial())
        host, port = route.proxy_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=EVENT_DEADLINE_S) as sock:  # promises 512 MiB, sends none of it
            sock.sendall(f"POST /t/{route.token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {512 * MIB}\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 413") and b"PLUMBLINE_PROXY_MAX_REQUEST_MIB" in data
        with pytest.raises(openai.APIStatusError) as raised:  # the SDK's own oversize request
            openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x" * (2 * MIB)}])
        assert raised.value.status_code == 413
        evidence = proxy.close_trial(route)
    assert [e["kind"] for e in evidence.proxy_errors] == ["request_too_large"] * 2 and hostile.requests == []


# --- the proxy fails itself (proxy_errors) ------------------------------------------------------------


def test_an_exception_inside_the_proxy_is_a_proxy_error_answered_500(hostile: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    hostile.behave = answer(200, chat_body())

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a bug in the proxy")

    monkeypatch.setattr(exchange_module, "_note_reply", broken)
    with proxy_for(hostile) as proxy:
        route = proxy.open_trial(trial())
        client = openai_client(route)
        # the answer went out before accounting failed: the agent has it; the proxy says it failed
        assert client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES).choices[0].message.content == "paid"
        monkeypatch.setattr(exchange_module, "rewrite", broken)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
        evidence = proxy.close_trial(route)
    assert "plumbline proxy internal error" in str(raised.value) and "Traceback" not in str(raised.value)
    assert [(e["call"], e["status"], e["kind"]) for e in evidence.proxy_errors] == [(1, 200, "internal"), (2, 500, "internal")]
    assert "a bug in the proxy" in evidence.proxy_errors[1]["detail"] and evidence.provider_failures == ()
