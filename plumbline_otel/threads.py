"""Threads: which per-call traces are one run, by the conversation each model request continues (issue 40 item 12).

An agent loop with only an SDK's zero-code instrumentation (OpenTelemetry's openai-v2 over the OpenAI client, with
no span of the app's around the loop) exports every model call as a trace of its own: a root LLM span and nothing
above it. Nothing in the trace says which run it belongs to, but the request does: each request of a tool loop sends
the conversation so far, so a call's input messages begin with the previous call's input messages followed by that
call's output message, then the tool results (or the user's next message). Such a trace continues the earlier one,
and the two are one run.

Per model call this module computes two keys over the conversation, each a hash of its messages normalised to what
every instrumentation records alike (role, text with whitespace collapsed, tool calls by name and canonical JSON
arguments, tool results by canonical content; message boundaries, message and response ids, finish reasons and
empty texts left out):

- `continues`: the conversation this request continues: its input messages up to and including the model's last
  message in them; None for a request the model has not spoken in yet (the first call of a run).
- `after`: the conversation after this call: its input messages and then its output.

A call continues another when its `continues` equals the other's `after`. Each key comes twice: `strict`, with the
call ids the model gave its tool calls (and the results that answer them), and `loose` without, for an
instrumentation that records the ids on one side only. The store (`Store.write_span_table`, `store/_threads.py`)
keeps the keys of every root LLM span (a trace with an agent or run span above its model calls is a run already) and records a link from a
continuing trace to the trace it continues in `trace_links`, so the traces are assembled together (rule 8 of
`assemble`) as one run with the first trace's id. A request that opens a new user turn (a new user message after the
model's answer: normalise's `step:new_user_turn`) starts a run of its own, as assembly's rule 6 makes it where one
trace holds a whole conversation, so it is linked to nothing before it: each turn is one run, whose id is the trace id
of its first call, and a long chat is not one ever-growing group of traces to assemble again with each new call. A
request is joined to a call only when that call is unique: by strict key when one matches, else by loose
key; two conversations alike in every message (the same first user message and the same model replies, ids aside)
stay apart. An identical first user message alone never joins anything: a first request continues nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from plumbline_otel.normalise import Message, begins_new_turn, call_messages, maybe_json

_ROLES = {"assistant": "assistant", "model": "assistant", "ai": "assistant", "bot": "assistant", "chatbot": "assistant",
          "system": "system", "developer": "system", "user": "user", "human": "user", "tool": "tool", "function": "tool"}
_SPACE = re.compile(r"\s+")
# The columns of the store's `conversation_keys` table (schema version 10).
# normalise's mark of a request that opens a new user turn: a run of its own (assembly's rule 6), so it is linked to no
# earlier call (the conversation's earlier turns are other runs) and a run's traces stay one turn's.
NEW_TURN = "step:new_user_turn"
KEY_COLUMNS = ("trace_id", "span_id", "start_ns", "end_ns", "continues", "continues_loose", "after", "after_loose")


@dataclass(frozen=True)
class ThreadKeys:
    """A model call's conversation keys (see the module's docstring); None where there is nothing to key."""

    continues: str | None
    continues_loose: str | None
    after: str | None
    after_loose: str | None
    # Where one side of the join was not recorded, a second pair of keys (kept as a row of its own, `#gap`):
    # - by call ids alone, for a request whose history lost the model's messages (OpenLIT's `gen_ai.input.messages`
    #   keeps the tool results, drops the assistant messages that called the tools): it continues the ids its tool
    #   results answer, in order; a call whose reply calls tools with ids is after the ids answered in its request
    #   then those it calls;
    # - by the request alone, for a call whose reply was not recorded (a streamed call under the Anthropic SDK's own
    #   tracing, or Traceloop's log records): a request continues the conversation before the model's last
    #   messages in it, and a call with no reply is after its own request.
    gap_continues: str | None = None
    gap_after: str | None = None


def _text(value: Any) -> str:
    return _SPACE.sub(" ", value).strip() if isinstance(value, str) else _canonical(value)


def _canonical(value: Any) -> str:
    """A value as one text however it was written: JSON text and the structure it encodes alike, keys sorted."""
    value = maybe_json(value) if isinstance(value, str) else value
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip()
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return _SPACE.sub(" ", str(value)).strip()


def _items(messages: Iterable[Message], role: str | None = None) -> list[tuple[str, ...]]:
    """The conversation as a sequence of items, message boundaries dropped: (role, text) per text, ("call", id, name,
    args) per tool call, ("result", id, content) per tool result. `role` stands in for messages that name none."""
    out: list[tuple[str, ...]] = []
    for m in messages:
        said = _ROLES.get((m.role or role or "").lower(), m.role or role or "?")
        out.extend((said, t) for t in (_text(t) for t in m.texts) if t)
        out.extend(("call", c.call_id or "", c.name, _canonical(c.args)) for c in m.calls)
        out.extend(("result", r.call_id or "", _canonical(r.result)) for r in m.results)
    return out


def _is_model(item: tuple[str, ...]) -> bool:
    return item[0] in ("assistant", "call")


def _key(items: list[tuple[str, ...]], strict: bool) -> str:
    kept = items if strict else [(i[0], *i[2:]) if i[0] in ("call", "result") else i for i in items]
    return hashlib.sha256(orjson.dumps(kept)).hexdigest()[:32]


def messages_of(attributes: dict[str, Any], events: list[tuple[str, dict[str, Any]]] | None = None) -> tuple[list[Message], list[Message]]:
    """A model call's input and output messages as normalise reads them (`normalise.call_messages`): from its span's
    attributes in whichever convention holds them (GenAI's JSON lists, OpenInference's `llm.input_messages.{i}.*`,
    Traceloop's older `gen_ai.prompt.{i}.*`, Langfuse's, …), or from its events or log records (`events`: (name,
    attributes) in time order; GenAI's one `gen_ai.client.inference.operation.details` record, or the older one record
    per message, `gen_ai.user.message` … `gen_ai.choice`)."""
    return call_messages(attributes, events or [])


def thread_keys(inputs: list[Message], outputs: list[Message]) -> ThreadKeys:
    """The keys of a model call with these input and output messages."""
    before = _items(inputs)
    said = max((i for i, item in enumerate(before) if _is_model(item)), default=-1)
    reply = _items(outputs, "assistant")
    continues = before[:said + 1] if said >= 0 else None
    after = before + reply if reply and any(_is_model(item) for item in reply) else None
    answered = list(dict.fromkeys(r.call_id for m in inputs for r in m.results if r.call_id))
    calls = [c.call_id or "" for m in outputs for c in m.calls]
    start = said  # where the model's last messages in the request begin
    while start > 0 and _is_model(before[start - 1]):
        start -= 1
    if said < 0:  # the model has not spoken in the request: by ids, if it answers calls
        gap_continues = _key([("ids", *answered)], True) if answered else None
    else:
        gap_continues = _key([("request",), *before[:start]], True)
    if after is None:  # no reply recorded: after its own request
        gap_after = _key([("request",), *before], True) if before else None
    else:
        gap_after = _key([("ids", *answered, *calls)], True) if calls and all(calls) else None
    return ThreadKeys(continues=None if continues is None else _key(continues, True),
                      continues_loose=None if continues is None else _key(continues, False),
                      after=None if after is None else _key(after, True),
                      after_loose=None if after is None else _key(after, False),
                      gap_continues=gap_continues, gap_after=gap_after)


def keys_of_attributes(attributes: dict[str, Any], opens_turn: bool = False,
                       events: list[tuple[str, dict[str, Any]]] | None = None) -> ThreadKeys | None:
    """The keys of a model call from its span's attributes, or its events or log records (`messages_of`); None when
    they hold no messages. A request that opens a new user turn (`opens_turn`: normalise marked it so; or its messages
    say so) continues no run."""
    inputs, outputs = messages_of(attributes, events)
    if not inputs and not outputs:
        return None
    keys = thread_keys(inputs, outputs)
    if opens_turn or begins_new_turn(inputs):
        keys = ThreadKeys(None, None, keys.after, keys.after_loose, None, keys.gap_after)
    return keys if keys.continues or keys.after or keys.gap_continues or keys.gap_after else None


def continuation_links(calls: list[tuple[str, str, int, int, ThreadKeys]]) -> list[tuple[str, str]]:
    """(continuing trace, trace it continues) for calls given as (trace id, span id, start, end, keys): what the
    store records (`store/_threads.py`'s `LINK_SQL`), for calls held in memory.

    A call continues the call, in another trace and ended before it started, whose `after` is its `continues`: by
    strict keys when any match, else by loose ones; a request that calls of more than one trace could have led to
    is joined to none."""
    out: set[tuple[str, str]] = set()
    for trace_id, _span, start, _end, keys in calls:
        if keys.continues is None:
            continue
        earlier = [(t, k) for t, _s, _start, end, k in calls if t != trace_id and end <= start]
        found = {t for t, k in earlier if k.after == keys.continues} or \
            {t for t, k in earlier if k.after_loose == keys.continues_loose}
        if len(found) == 1:
            out.add((trace_id, found.pop()))
    for trace_id, _span, start, _end, keys in calls:  # the gap keys, where one side was not recorded
        found = {t for t, _s, _start, end, k in calls if t != trace_id and end <= start and keys.gap_continues
                 and k.gap_after == keys.gap_continues}
        if len(found) == 1:
            out.add((trace_id, found.pop()))
    return sorted(out)
