"""The store's side of `plumbline_otel/threads.py`: the root model calls of each write keyed, the keys kept in
`conversation_keys` (schema version 10), and each trace linked in `trace_links` to the trace whose conversation its
request continues, so `Store.assemble` builds the traces of one run together (issue 40 item 12).

A call's messages are on its span, or in its log records (openai-v2 with content captured as events writes one
`gen_ai.client.inference.operation.details` record per call, holding `gen_ai.input.messages`/`.output.messages`;
Traceloop's `use_attributes=False` and older openai-v2 one record per message, `gen_ai.system.message` …
`gen_ai.choice`), read as normalise reads them (`threads.messages_of`): whichever of the span and its records is
stored second keys the call, so they may arrive in either order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plumbline_otel.normalise import log_event_attributes, maybe_json
from plumbline_otel.threads import KEY_COLUMNS, NEW_TURN, keys_of_attributes, messages_of

Registered = Callable[[str, pa.Table], AbstractContextManager[None]]
"""`Store._registered`: an Arrow table readable in SQL under a name for the block."""

# Keep a write's keys (registered as `thread_batch`) and link its traces to the traces they continue and that continue
# them, as `threads.continuation_links` does, in `trace_links` (traces linked there are assembled together).
KEYS_SQL = f"INSERT OR IGNORE INTO conversation_keys SELECT {', '.join(KEY_COLUMNS)} FROM thread_batch"
LINK_SQL = """INSERT OR IGNORE INTO trace_links SELECT trace_id, min(linked_trace_id) FROM (
    SELECT b.trace_id, b.span_id, a.trace_id AS linked_trace_id, (b.continues = a.after) AS strict,
           bool_or(b.continues = a.after) OVER (PARTITION BY b.trace_id, b.span_id) AS any_strict
    FROM conversation_keys b JOIN conversation_keys a ON b.continues_loose = a.after_loose
    WHERE a.trace_id <> b.trace_id AND a.end_ns <= b.start_ns
      AND (b.trace_id IN (SELECT trace_id FROM thread_batch) OR a.trace_id IN (SELECT trace_id FROM thread_batch)))
    WHERE strict = any_strict GROUP BY trace_id, span_id HAVING count(DISTINCT linked_trace_id) = 1"""
# The stored log records of root model calls whose span recorded no messages (`unkeyed`: trace and span ids).
_LOGGED_SQL = """SELECT l.trace_id, l.span_id, l.event_name, l.attributes, l.body FROM logs l
    JOIN unkeyed u ON l.trace_id = u.trace_id AND l.span_id = u.span_id
    WHERE l.trace_id IN (SELECT trace_id FROM unkeyed) ORDER BY l.time_ns, l.observed_ns, l.log_id"""
# The stored root model-call spans a write's log records (`logged`) belong to, not keyed yet.
_CALLS_SQL = """SELECT s.trace_id, s.span_id, s.start_ns, s.end_ns, s.shapes FROM spans s
    JOIN logged l ON s.trace_id = l.trace_id AND s.span_id = l.span_id
    WHERE s.trace_id IN (SELECT trace_id FROM logged) AND s.parent_span_id IS NULL AND s.step_kind = 'llm_call'
      AND NOT EXISTS (SELECT 1 FROM conversation_keys k WHERE k.trace_id = s.trace_id AND k.span_id = s.span_id)"""


# A call's keys for where one side of a join was not recorded (`ThreadKeys.gap_continues`, `.gap_after`: by call ids
# alone, or by the request alone) are kept as a second row, its span id suffixed so: their hashes are of other
# domains than the conversation keys', so rows of the two kinds never match.
GAP_ROW = "#gap"
Events = list[tuple[str, dict[str, Any]]]
"""A call's log records as (event name, attributes with the body's keys), in time order."""


def _key_table(rows: Iterable[tuple[dict[str, Any], dict[str, Any], bool, Events]]) -> pa.Table | None:
    """(call: trace_id, span_id, start_ns, end_ns; attributes; opens a turn; log records) as `KEY_COLUMNS` rows; None
    for none."""
    columns: dict[str, list[Any]] = {name: [] for name in KEY_COLUMNS}
    for call, attributes, opens_turn, events in rows:
        keys = keys_of_attributes(attributes, opens_turn, events)
        if keys is None:
            continue
        kept: list[tuple[str, str | None, str | None, str | None, str | None]] = [
            (call["span_id"], keys.continues, keys.continues_loose, keys.after, keys.after_loose)]
        if keys.gap_continues or keys.gap_after:  # the keys where one side was not recorded: a row of their own
            kept.append((call["span_id"] + GAP_ROW, keys.gap_continues, keys.gap_continues, keys.gap_after, keys.gap_after))
        for span_id, *values in kept:
            for name, value in zip(KEY_COLUMNS, (call["trace_id"], span_id, call["start_ns"], call["end_ns"], *values)):
                columns[name].append(value)
    if not columns["trace_id"]:
        return None
    return pa.table({name: pa.array(values, pa.int64() if name.endswith("_ns") else pa.string()) for name, values in columns.items()})


def _link(execute: Callable[[str], Any], registered: Registered, keyed: pa.Table | None) -> None:
    if keyed is not None:
        with registered("thread_batch", keyed):
            execute(KEYS_SQL)
            execute(LINK_SQL)


def link_spans(execute: Callable[[str], Any], fetch: Callable[[str], list[Any]], registered: Registered, fresh: pa.Table) -> None:
    """Key a span write's root model calls (a `rows.span_table`) and link their traces. A call whose span holds no
    messages is keyed from its stored log record, if that came first. A model call under any other span (an
    agent's, a run's, the app's) is part of that trace's run already and is not keyed."""
    roots = fresh.filter(pc.and_(pc.is_null(fresh["parent_span_id"]), pc.equal(fresh["step_kind"], "llm_call")))
    if not roots.num_rows:
        return
    rows: list[tuple[dict[str, Any], dict[str, Any], bool, Events]] = []
    bare = []
    for call in roots.select(["trace_id", "span_id", "start_ns", "end_ns", "attributes", "shapes"]).to_pylist():
        attributes = maybe_json(call["attributes"]) if call["attributes"] else None
        attributes = attributes if isinstance(attributes, dict) else {}
        inputs, outputs = messages_of(attributes)
        if inputs or outputs:
            rows.append((call, attributes, NEW_TURN in (call["shapes"] or []), []))
        else:
            bare.append(call)
    if bare:
        found = _stored_records(fetch, registered, [(c["trace_id"], c["span_id"]) for c in bare])
        rows += [(c, {}, NEW_TURN in (c["shapes"] or []), found[(c["trace_id"], c["span_id"])]) for c in bare
                 if (c["trace_id"], c["span_id"]) in found]
    _link(execute, registered, _key_table(rows))


def link_logs(execute: Callable[[str], Any], fetch: Callable[[str], list[Any]], registered: Registered, logs: pa.Table) -> None:
    """Key the stored root model calls a log write brought records of (their spans came first), from all their stored
    records (a call's per-message records may come in more than one write), and link them."""
    spans = {(t, s) for t, s in zip(logs["trace_id"].to_pylist(), logs["span_id"].to_pylist()) if t is not None and s is not None}
    if not spans:
        return
    with registered("logged", pa.table({"trace_id": [t for t, _ in spans], "span_id": [s for _, s in spans]})):
        calls = fetch(_CALLS_SQL)
    if not calls:
        return
    found = _stored_records(fetch, registered, [(t, s) for t, s, *_ in calls])
    rows: list[tuple[dict[str, Any], dict[str, Any], bool, Events]] = [
        ({"trace_id": t, "span_id": s, "start_ns": start, "end_ns": end}, {}, NEW_TURN in (shapes or []), found[(t, s)])
        for t, s, start, end, shapes in calls if (t, s) in found]
    _link(execute, registered, _key_table(rows))


def _stored_records(fetch: Callable[[str], list[Any]], registered: Registered, spans: list[tuple[str, str]]) -> dict[tuple[str, str], Events]:
    """(trace id, span id) -> the stored log records of each of these spans that has any, as events in time order."""
    with registered("unkeyed", pa.table({"trace_id": [t for t, _ in spans], "span_id": [s for _, s in spans]})):
        records = fetch(_LOGGED_SQL)
    out: dict[tuple[str, str], Events] = {}
    for trace_id, span_id, name, attributes, body in records:
        out.setdefault((trace_id, span_id), []).append((name or "", log_event_attributes(attributes, body)))
    return out
