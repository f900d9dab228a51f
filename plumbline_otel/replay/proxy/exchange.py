"""One model call through the proxy: rewrite, fault, serve from the cassette or meter and forward,
relay (plain or SSE), account, record, and emit its span.

The order matters and is the same in ``record`` and ``replay`` mode, so a replay is bit-for-bit:
rewrites first (they depend only on the trial's plan and the conversation), then injected faults
(never forwarded, never cached, no occurrence consumed), then the cassette by trial identity,
then the budget (a cassette hit costs nothing), then the provider.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from plumbline_otel.replay.budget import BudgetExceeded
from plumbline_otel.replay.cache import cache_key, content_digest, request_content
from plumbline_otel.replay.jsonvalue import JsonObject, to_int
from plumbline_otel.replay.limits import Holding
from plumbline_otel.replay.pricing import Usage, UsageAccumulator, model_price, parse_sse, price, usage_from_body
from plumbline_otel.replay.proxy.evidence import TrialState
from plumbline_otel.replay.proxy.services import HOP_BY_HOP, ProxyServices, Responder, refuse
from plumbline_otel.replay.proxy.spans import CallRecord, emit
from plumbline_otel.replay.proxy.wire import (
    PROVIDER,
    Api,
    Reply,
    add_decoys,
    apply_sampling,
    error_body,
    replace_tool_results,
    reply_from_body,
    reply_from_events,
    request_tool_calls,
)

DEFAULT_MAX_OUTPUT = 32_768  # the output bound assumed for a request that states none
_OVERHEAD_TOKENS = 1000  # the provider's own prompt for tools and formatting
def estimate_usd(model: str | None, request_bytes: int, body: Mapping[str, object]) -> float | None:
    """A conservative bound on a call's cost before it is made (None: the model has no price).

    A token covers at least one byte of the request, every input token is priced at the dearest
    input rate (a 1-hour cache write, the long-context tier), and the output cannot pass the
    request's token limit.
    """
    rates = model_price(model)
    if rates is None:
        return None
    tiers = [rates, rates.long] if rates.long is not None else [rates]
    in_rate = max(max(r.input, r.cache_write, r.cache_write_1h) for r in tiers if r is not None)
    out_rate = max(r.output for r in tiers if r is not None)
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens") or DEFAULT_MAX_OUTPUT
    return ((request_bytes + _OVERHEAD_TOKENS) * in_rate + to_int(limit) * out_rate) / 1_000_000


# --- rewrites ----------------------------------------------------------------------------------


def rewrite(state: TrialState, api: Api, body: JsonObject, call: int) -> None:
    """Apply the trial's request-side perturbations to ``body`` and note what changed."""
    # a paraphrased user turn from the branch point on (issue 44, replay.tape)
    if state.branch is not None and state.branch.rewrite_turn(state.trial.metadata, api, body, call):
        state.turn_rewrites += 1
    plan = state.tool_result_fault
    if plan is not None:
        state.learn_tool_calls([(c.id, c.name) for c in request_tool_calls(api, body)])
        target = state.fault_call_id()
        if target is not None and replace_tool_results(api, body, target, plan.error_message):
            with state.lock:
                first = not any(f["kind"] == "tool_result_fault" for f in state.faults)
            if first:
                state.add_fault("tool_result_fault", call, f"result of {plan.tool} call {target} shown to the model as: {plan.error_message}")
    if state.sampling:
        changes = apply_sampling(api, body, state.sampling)
        with state.lock:  # only a value the provider now gets differently is evidence the variant reached it
            state.sampling_changes.extend({"call": call, **c} for c in changes if c["changed"])
            state.sampling_unchanged.extend({"call": call, **c} for c in changes if not c["changed"])
    if state.decoys:
        added = add_decoys(api, body, state.decoys)
        with state.lock:
            state.decoys_offered.extend(n for n in added if n not in state.decoys_offered)


def inject_model_fault(state: TrialState, api: Api, call: int, out: Responder) -> str:
    """Answer call ``call`` with the planned model fault instead of forwarding it; the fault's name."""
    plan = state.model_fault
    assert plan is not None
    provider = PROVIDER[api]
    headers = [("content-type", "application/json")]
    if plan.kind == "rate_limit":
        status, kind, message = 429, "rate_limit_error", "Rate limit exceeded; retry later (plumbline model_fault)"
    elif plan.kind == "overloaded":
        status = 529 if provider == "anthropic" else 503
        kind, message = ("overloaded_error" if provider == "anthropic" else "server_error"), "Overloaded (plumbline model_fault)"
    else:
        status, kind = 504, ("timeout_error" if provider == "anthropic" else "timeout")
        message = f"Request timed out after {plan.hold_s:g}s (plumbline model_fault)"
    # Witnessed before the hold: the agent may give up and close its trial while the call is held.
    state.add_fault(plan.kind, call, f"HTTP {status} {kind}" + (f" after holding {plan.hold_s:g}s" if plan.kind == "timeout" else ""))
    if plan.kind == "timeout":
        time.sleep(plan.hold_s)
    out.send(status, headers, error_body(provider, status, kind, message))
    return f"{plan.kind}:{status}"


# --- relaying ----------------------------------------------------------------------------------


class _Splitter:
    """Cuts complete SSE events (with their blank-line terminator) off a growing buffer.

    The scan resumes where the last one stopped, so a peer that never sends a blank line costs
    one pass over its bytes, not one pass per chunk.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self._scanned = 0

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        self.buffer += chunk
        while True:
            start = max(0, self._scanned - 3)
            ends = [(i, n) for i, n in ((self.buffer.find(b"\n\n", start), 2), (self.buffer.find(b"\r\n\r\n", start), 4)) if i >= 0]
            if not ends:
                self._scanned = len(self.buffer)
                return
            i, n = min(ends)
            block = bytes(self.buffer[:i + n])
            del self.buffer[:i + n]
            self._scanned = 0
            yield block


def _usage_only(block: bytes) -> bool:
    """A Chat stream's final usage chunk (empty choices), which the agent did not ask for."""
    if b'"usage"' not in block or b"data:" not in block:
        return False
    try:
        value = orjson.loads(block.split(b"data:", 1)[1].strip())
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and value.get("choices") == [] and isinstance(value.get("usage"), dict)


@dataclass
class Relayed:
    """How relaying one answer went.

    ``payload``: what the provider (or the cassette) sent, as kept (never past the response
    limit). ``whole``: the agent got all of it. ``complete``: the provider's answer arrived
    whole (False: cut by the provider, past the limit, or no longer read because the agent left).
    ``failure``: (kind, detail) of the provider's own failure while relaying; ``proxy_error`` the
    proxy's (its memory limit). ``answered``: the status the proxy answered in place of the
    provider's, when it did.
    """

    payload: bytes
    whole: bool
    complete: bool = True
    failure: tuple[str, str] | None = None
    proxy_error: tuple[str, str] | None = None
    agent_left: bool = False
    answered: int | None = None
    fault_cut: bool = False  # the stream_cut fault dropped the agent's answer


def _transport_failure(exc: BaseException) -> tuple[str, str]:
    kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "stream_cut"
    return kind, f"{type(exc).__name__}: {exc}"


def relay(out: Responder, status: int, headers: list[tuple[str, str]], chunks: Iterable[bytes], *, sse: bool, strip_usage: bool,
          cut_after: int | None, provider: str = "openai", limit: int | None = None, holding: Holding | None = None,
          recorded_cut: bool = False) -> Relayed:
    """Pass the answer to the agent as it arrives, holding at most ``limit`` bytes of it.

    ``cut_after``: the ``stream_cut`` fault drops a stream after that many events (a whole body
    after half its bytes); the rest is still read from upstream, so the call is metered and
    recorded whole. A provider that cuts a stream (or stalls past the read timeout) after its head
    was sent gets the same treatment from the proxy: the connection is dropped with no chunked
    terminator, which is how every SDK sees an interrupted stream, and never a second status line.
    An agent that hangs up stops the relay: upstream is no longer read. ``recorded_cut``: the
    cassette's answer was itself cut, and is replayed cut.
    """
    limit = limit if limit is not None else 1 << 62
    return _relay_stream(out, status, headers, chunks, strip_usage, cut_after, limit, holding, recorded_cut) if sse else \
        _relay_whole(out, status, headers, chunks, cut_after, provider, limit, holding)


def _relay_whole(out: Responder, status: int, headers: list[tuple[str, str]], chunks: Iterable[bytes], cut_after: int | None,
                 provider: str, limit: int, holding: Holding | None) -> Relayed:
    """A whole (non-streamed) answer: read up to ``limit``, then sent with its length; past the limit, refused with 502."""
    declared = next((v for k, v in headers if k.lower() == "content-length"), None)
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        message = f"the provider's answer is {int(declared)} bytes, past the proxy's limit of {limit} (PLUMBLINE_PROXY_MAX_RESPONSE_MIB)"
        refuse(out, provider, 502, "api_error", f"plumbline proxy: {message}")
        return Relayed(b"", False, False, failure=("too_large", message), answered=502)
    buffer = bytearray()
    try:
        for chunk in chunks:
            if len(buffer) + len(chunk) > limit:
                message = f"the provider's answer passed the proxy's limit of {limit} bytes (PLUMBLINE_PROXY_MAX_RESPONSE_MIB); not read further"
                refuse(out, provider, 502, "api_error", f"plumbline proxy: {message}")
                return Relayed(b"", False, False, failure=("too_large", message), answered=502)  # nothing of it is kept
            if holding is not None and not holding.take(len(chunk)):
                message = "the proxy holds as much as PLUMBLINE_PROXY_MAX_HELD_MIB allows across its calls; retry"
                refuse(out, provider, 503, "overloaded_error" if provider == "anthropic" else "server_error", f"plumbline proxy: {message}")
                return Relayed(b"", False, False, proxy_error=("memory", message), answered=503)
            buffer += chunk
    except httpx.HTTPError as exc:
        kind, detail = _transport_failure(exc)
        status_out = 504 if kind == "timeout" else 502
        refuse(out, provider, status_out, "timeout_error" if kind == "timeout" else "api_error",
               f"plumbline proxy: the provider's answer broke off after {len(buffer)} bytes: {detail}")
        return Relayed(bytes(buffer), False, False, failure=(kind, f"answer broke off after {len(buffer)} bytes: {detail}"),
                       answered=status_out)
    payload = bytes(buffer)
    if cut_after is not None:
        out.send_cut(status, headers, payload)
        return Relayed(payload, False, fault_cut=True)
    out.send(status, headers, payload)
    return Relayed(payload, True)


def _relay_stream(out: Responder, status: int, headers: list[tuple[str, str]], chunks: Iterable[bytes], strip_usage: bool,
                  cut_after: int | None, limit: int, holding: Holding | None, recorded_cut: bool) -> Relayed:
    out.start_stream(status, headers)
    raw, splitter, sent, cut = bytearray(), _Splitter(), 0, False
    result = Relayed(b"", True)
    try:
        for chunk in chunks:
            if len(raw) + len(chunk) > limit:
                result.complete, result.failure = False, ("too_large", f"the stream passed the proxy's limit of {limit} bytes "
                                                          "(PLUMBLINE_PROXY_MAX_RESPONSE_MIB) and was cut there")
                break
            if holding is not None and not holding.take(len(chunk)):
                result.complete, result.proxy_error = False, ("memory", "the proxy holds as much as PLUMBLINE_PROXY_MAX_HELD_MIB "
                                                              "allows across its calls; the stream was cut")
                break
            raw += chunk
            for block in splitter.feed(chunk):
                if cut or (strip_usage and _usage_only(block)):
                    continue
                if cut_after is not None and sent >= cut_after:
                    out.abort()
                    cut = True
                    continue
                out.write(block)
                sent += 1
            if out.gone and not cut:  # the agent hung up: nobody reads on, so the provider is not read on either
                result.complete, result.agent_left = False, True
                break
    except httpx.HTTPError as exc:
        kind, detail = _transport_failure(exc)
        result.complete, result.failure = False, (kind, f"stream broke off after {len(raw)} bytes: {detail}")
    result.payload, result.fault_cut = bytes(raw), cut
    if cut or not result.complete or recorded_cut:
        if not out.gone:
            if splitter.buffer and not cut:
                out.write(bytes(splitter.buffer))
            out.abort()  # no chunked terminator: the SDK raises on an incomplete stream, as with the provider's own cut
        result.whole = False
        return result
    if splitter.buffer:
        out.write(bytes(splitter.buffer))
    out.end_stream()
    return result


# --- the call ----------------------------------------------------------------------------------


def handle_call(proxy: ProxyServices, state: TrialState, api: Api, path: str, raw: bytes, headers: Mapping[str, str],
                out: Responder) -> None:
    """Serve one model-API call of the trial behind ``state``."""
    provider = PROVIDER[api]
    started = time.time_ns()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        refuse(out, provider, 400, "invalid_request_error", f"plumbline proxy: the body of POST {path} is not a JSON object")
        return
    call = state.next_call()
    out.call = call
    if state.branch is not None and state.branch.serves_model_call(call) is not None:
        serve_from_tape(proxy, state, api, call, body, started, out)  # the prefix of a branch-point replay: no provider call
        return
    rewrite(state, api, body, call)
    strip_usage = False
    if api == "chat" and body.get("stream") is True:
        given = body.get("stream_options")
        options: dict[str, Any] = given if isinstance(given, dict) else {}
        if not options.get("include_usage"):  # the usage chunk is needed to meter the call exactly
            body["stream_options"] = {**options, "include_usage": True}
            strip_usage = True
    plan = state.model_fault
    if plan is not None and plan.due(call) and plan.kind != "stream_cut":
        fault = inject_model_fault(state, api, call, out)
        _finish(proxy, state, api, call, body, started, 0, "fault", None, None, None, fault=fault, key=None)
        return
    cut_after = plan.after_events if plan is not None and plan.due(call) and plan.kind == "stream_cut" else None
    content = request_content("POST", path, body)
    digest = content_digest(content)
    key = cache_key(state.trial.identity, content, state.occurrence(digest))
    cache = proxy.cache if proxy.cache is not None and proxy.cache.mode != "off" else None
    entry = cache.get(key) if cache is not None else None
    if entry is not None:
        with state.lock:
            state.cache_hits += 1
        ctype = str(entry.get("content_type") or "application/json")
        relayed = relay(out, to_int(entry["status"]), [("content-type", ctype), ("x-plumbline-cache", "hit")], [entry_body(entry)],
                        sse="event-stream" in ctype, strip_usage=strip_usage, cut_after=cut_after, provider=provider,
                        recorded_cut=bool(entry.get("incomplete")))
        if entry.get("incomplete"):
            relayed.complete = False
        _after(proxy, state, api, call, body, started, to_int(entry["status"]), "cache", relayed, ctype, None, key, cut_after, None, len(raw))
        return
    if cache is not None and cache.mode == "replay":
        with state.lock:
            state.refused_offline += 1
        reason = f"offline: no recorded answer for trial {state.trial.identity.trial_id} (request {digest[:12]})"
        refuse(out, provider, 424, "plumbline_replay_miss", f"plumbline proxy: {reason}")
        _finish(proxy, state, api, call, body, started, 424, "refused", None, None, None, fault=None, key=key)
        return
    forwarded = orjson.dumps(body)
    del content  # the request's copies go before the answer's arrive
    model = body.get("model") if isinstance(body.get("model"), str) else None
    refused, estimate = _ensure(state, model, len(forwarded), body)
    if refused is not None:
        refuse(out, provider, 429, "plumbline_budget_exceeded", f"plumbline proxy: {refused}")
        _finish(proxy, state, api, call, body, started, 429, "refused", None, None, None, fault=None, key=key)
        return
    _forward(proxy, state, api, call, path, body, forwarded, headers, out, started, key, strip_usage, cut_after, estimate)


def serve_from_tape(proxy: ProxyServices, state: TrialState, api: Api, call: int, body: JsonObject, started: int,
                    out: Responder) -> None:
    """Answer a prefix call of a branch-point replay with the tape's response (issue 44), never the provider's.

    The agent's request is first compared with the recorded one (``tape.request_difference``): a request that
    differs means the agent is no longer on the recorded run, so the call is refused (the agent stops at once)
    and the divergence goes into the evidence, where the driver makes the trial missing, never scored."""
    from plumbline_otel.replay.tape import render_reply, request_difference

    branch = state.branch
    assert branch is not None
    step = branch.serves_model_call(call)
    assert step is not None
    provider = PROVIDER[api]
    difference = request_difference(branch.tape, step, api, body)
    if difference is not None:
        with state.lock:
            branch.diverged.append({"step": step.index, "call": call, "detail": difference})
        refuse(out, provider, 409, "plumbline_branch_diverged",
               f"plumbline proxy: diverged at step {step.index} from the recorded run: {difference}")
        _finish(proxy, state, api, call, body, started, 409, "diverged", None, None, None, fault=None, key=None)
        return
    if step.body is not None and step.api == api:
        ctype, payload = step.content_type or "application/json", step.body
    else:
        stream = body.get("stream") is True
        ctype, payload = render_reply(step, api, stream, str(body.get("model") or ""),
                                      bool(_include_usage(body)) if stream else False)
    with state.lock:
        state.tape_served += 1
    relayed = relay(out, step.status, [("content-type", ctype), ("x-plumbline-tape", str(step.index))], [payload],
                    sse="event-stream" in ctype, strip_usage=False, cut_after=None, provider=provider, recorded_cut=step.incomplete)
    _after(proxy, state, api, call, body, started, step.status, "tape", relayed, ctype, None, "", None, None, 0)


def _include_usage(body: Mapping[str, object]) -> object:
    """A streamed Chat request's ``stream_options.include_usage``."""
    options = body.get("stream_options") or {}
    return options.get("include_usage") if isinstance(options, Mapping) else None


def entry_body(entry: Mapping[str, object]) -> bytes:
    """A cassette entry's answer bytes (``body_encoding: base64`` for an answer that was not UTF-8)."""
    if entry.get("body_encoding") == "base64":
        return base64.b64decode(str(entry["body"]))
    return str(entry["body"]).encode("utf-8")


def _ensure(state: TrialState, model: str | None, size: int, body: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """Grow the trial's reservation by this call's bound; (refusal reason or None, the bound)."""
    estimate = estimate_usd(model, size, body)
    budget = state.budget
    if budget is None:
        return None, estimate
    reason: str | None = None
    if estimate is None:
        if budget.cap.limit is None:
            return None, None
        reason = f"budget: model {model!r} has no price, so the spend cap cannot bound this call"
    else:
        try:
            budget.ensure(estimate)
        except BudgetExceeded as exc:
            reason = f"budget: {exc}"
    if reason is not None:
        with state.lock:
            state.refused_budget += 1
            state.budget_stop = state.budget_stop or reason
    return reason, estimate


def _forward(proxy: ProxyServices, state: TrialState, api: Api, call: int, path: str, body: dict[str, Any], forwarded: bytes,
             headers: Mapping[str, str], out: Responder, started: int, key: str, strip_usage: bool, cut_after: int | None,
             estimate: float | None) -> None:
    provider = PROVIDER[api]
    url = proxy.upstream_url(provider, path)
    with state.lock:
        state.upstream_calls += 1
    holding = Holding(proxy.memory)
    try:
        try:
            with proxy.http.stream("POST", url, content=forwarded, headers=proxy.upstream_headers(provider, headers)) as response:
                ctype = response.headers.get("content-type") or ""
                kept = [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP]
                relayed = relay(out, response.status_code, kept, response.iter_bytes(), sse="event-stream" in ctype,
                                strip_usage=strip_usage, cut_after=cut_after, provider=provider, limit=proxy.limits.max_response_bytes,
                                holding=holding)
                status = response.status_code
        except httpx.HTTPError as exc:  # no answer at all: refused, reset, timed out before the head
            kind = "unreachable" if isinstance(exc, httpx.ConnectError) else "timeout" if isinstance(exc, httpx.TimeoutException) else "transport"
            status = 504 if kind == "timeout" else 502
            detail = f"{type(exc).__name__}: {exc}"
            refuse(out, provider, status, "timeout_error" if kind == "timeout" else "api_error",
                   f"plumbline proxy: upstream {url} failed: {detail}")
            state.provider_failed(call, status, kind, f"{url}: {detail}")
            _finish(proxy, state, api, call, body, started, status, "live", None, None, None, fault=None, key=key)
            return
        _after(proxy, state, api, call, body, started, status, "live", relayed, ctype, estimate, key, cut_after, url, len(forwarded))
    finally:
        holding.release()  # after _after: the answer is held until it is accounted


def received_usd(model: str | None, usage: Usage | None, reply: Reply | None, request_bytes: int) -> float | None:
    """A bound on what an answer that broke off cost, from what was received.

    Input: the usage the stream reported before it broke (Anthropic's ``message_start``), else
    one token per request byte plus the API's own prompt (``estimate_usd``'s rule). Output: at
    least the usage reported, and at most one token per character of text and tool arguments
    received. Never zero for a call the provider began to answer.
    """
    received = 0
    if reply is not None:
        received = len(reply.text) + sum(len(c.arguments) if isinstance(c.arguments, str) else len(orjson.dumps(c.arguments))
                                         for c in reply.tool_calls)
    if usage is not None and usage.prompt_tokens:
        bound = Usage(usage.input_tokens, max(usage.output_tokens, received), usage.cache_read_tokens, usage.cache_write_tokens,
                      usage.cache_write_1h_tokens, model=usage.model)
    else:
        bound = Usage(request_bytes + _OVERHEAD_TOKENS, max(received, usage.output_tokens if usage else 0), model=model)
    return price(model, bound)


def _after(proxy: ProxyServices, state: TrialState, api: Api, call: int, body: dict[str, Any], started: int, status: int,
           source: str, relayed: Relayed, ctype: str, estimate: float | None, key: str, cut_after: int | None, url: str | None,
           request_bytes: int) -> None:
    """Account a relayed answer: usage and exact cost (live only), cassette, failures seen, decoys proposed, tool ids, span."""
    payload = relayed.payload
    sse = "event-stream" in ctype
    events: list[dict[str, Any]] = []
    parsed: Any = None
    if sse:
        events = parse_sse(payload)
    elif payload:
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            parsed = None
    answered = relayed.answered or status
    ok = 200 <= answered < 300
    reply = (reply_from_events(api, events) if sse else reply_from_body(api, parsed) if isinstance(parsed, dict) else None) if ok else None
    usage = _usage(events, parsed) if ok else None
    model = body.get("model") if isinstance(body.get("model"), str) else None
    garbage = ok and relayed.complete and (not events if sse else not isinstance(parsed, dict))
    cost: float | None = None
    if source == "live":
        charged = 0.0  # an error answer is not billed
        if 200 <= status < 300:
            if relayed.complete and usage is not None:
                cost = price(model, usage)
                state.charge(model, usage, cost, None)
                charged = cost or 0.0  # unpriced: only possible without a cap, and said in the evidence
            elif not relayed.complete and sse:  # broke off: what was received, marked inexact
                cost = received_usd(model, usage, reply, request_bytes)
                state.charge(model, None, None, cost if cost is not None else estimate)
                charged = cost if cost is not None else (estimate or 0.0)
            else:  # no usage in the answer, or a whole answer that broke off: the bound is charged, marked inexact
                state.charge(model, None, None, estimate)
                charged = estimate or 0.0
        if state.budget is not None:
            state.budget.add(charged)
        if ok and payload and proxy.cache is not None and proxy.cache.mode == "record":
            _record(proxy, state, key, api, model, status, ctype, payload, started, url, incomplete=not relayed.complete,
                    request=body)
    if source == "live" or source == "cache":
        _note_failure(state, call, answered, status, relayed, payload, garbage, source)
    if relayed.proxy_error is not None:
        state.proxy_failed(call, answered, *relayed.proxy_error)
    fault = None
    if relayed.fault_cut:
        fault = "stream_cut"
        detail = f"stream dropped after {cut_after} events" if sse else "body dropped after half its bytes"
        state.add_fault("stream_cut", call, detail)
    if reply is not None:
        _note_reply(state, reply)
    _finish(proxy, state, api, call, body, started, answered, source, reply, usage, cost, fault=fault, key=key,
            incomplete=not relayed.complete)


def _note_failure(state: TrialState, call: int, answered: int, status: int, relayed: Relayed, payload: bytes, garbage: bool,
                  source: str) -> None:
    """Whether the provider failed this call by itself, and how (see ``ProxyEvidence``)."""
    where = "" if source == "live" else "(as recorded in the cassette) "
    if relayed.failure is not None:
        state.provider_failed(call, answered, relayed.failure[0], where + relayed.failure[1])
    elif status >= 500 or status == 429:
        excerpt = payload[:300].decode("utf-8", "replace")
        state.provider_failed(call, status, "rate_limited" if status == 429 else "status", f"{where}HTTP {status}: {excerpt}")
    elif garbage:
        shown = payload[:120]
        try:
            text = repr(shown.decode("utf-8"))
        except UnicodeDecodeError:
            text = f"undecodable bytes {shown!r}"
        state.provider_failed(call, status, "garbage", f"{where}a {status} answer that is no API response ({len(payload)} bytes: {text})")


def _usage(events: list[dict[str, Any]], parsed: Any) -> Usage | None:
    if events:
        meter = UsageAccumulator()
        for event in events:
            meter.feed(event)
        return meter.usage
    return usage_from_body(parsed) if isinstance(parsed, dict) else None


def _record(proxy: ProxyServices, state: TrialState, key: str, api: Api, model: str | None, status: int, ctype: str,
            payload: bytes, started: int, url: str | None, *, incomplete: bool = False,
            request: Mapping[str, Any] | None = None) -> None:
    """The exchange's cassette line: the answer as text, or base64 (``body_encoding``) when it is not UTF-8;
    ``incomplete`` when it broke off (replayed cut at the same byte)."""
    assert proxy.cache is not None
    identity = state.trial.identity
    try:
        text, encoding = payload.decode("utf-8"), None
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode("ascii"), "base64"
    entry: dict[str, Any] = {
        "key": key, "trial_id": identity.trial_id, "perturbation": identity.perturbation, "variant": identity.variant,
        "repeat": identity.repeat, "api": api, "model": model, "status": status, "content_type": ctype,
        "body": text, "latency_ms": round((time.time_ns() - started) / 1e6, 1), "recorded_at": time.time(),
        "upstream": url,
        "request": dict(request) if request is not None else None,  # what the agent sent (after the trial's rewrites): a branch-point replay's prefix is checked against it
    }
    if encoding is not None:
        entry["body_encoding"] = encoding
    if incomplete:
        entry["incomplete"] = True
    proxy.cache.put(entry)


def _note_reply(state: TrialState, reply: Reply) -> None:
    """Learn the proposed tool calls' ids (for tool_result_fault) and which decoys the model reached for."""
    state.learn_tool_calls([(c.id, c.name) for c in reply.tool_calls])
    decoys = {str(d.get("name") or (fn.get("name") if isinstance(fn := d.get("function") or {}, dict) else None)) for d in state.decoys}
    with state.lock:
        for c in reply.tool_calls:
            if c.name in decoys and c.name not in state.decoys_proposed:
                state.decoys_proposed.append(c.name)


def _finish(proxy: ProxyServices, state: TrialState, api: Api, call: int, body: dict[str, Any], started: int, status: int,
            source: str, reply: Reply | None, usage: Usage | None, cost: float | None, *, fault: str | None, key: str | None,
            incomplete: bool = False) -> None:
    """The exchange's line in the evidence, and its span."""
    ended = time.time_ns()
    with state.lock:
        line = {"call": call, "api": api, "model": body.get("model"), "status": status, "source": source, "key": key,
                "fault": fault, "cost_usd": cost, "ms": round((ended - started) / 1e6, 2)}
        if incomplete:
            line["incomplete"] = True
        state.exchanges.append(line)
    if proxy.tracer_provider is not None:
        try:
            parent = proxy.recorder.model_call(api, body) if proxy.recorder is not None else None
            if parent is not None and reply is not None:
                proxy.recorder.proposed(parent, [c.name for c in reply.tool_calls])  # type: ignore[union-attr]
            emit(proxy.tracer_provider, CallRecord(state.trial.identity, api, call, body, started, ended, status,
                                                                source, reply, usage, cost, fault), proxy.limits.span_payload_bytes,
                       parent)
        except Exception:  # noqa: BLE001 - telemetry never fails the agent's call
            proxy.span_failed()
