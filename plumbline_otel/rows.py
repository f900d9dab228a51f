"""Rows: span records and trajectories as the Arrow tables the store inserts, and back.

The shard workers build these tables where the records are made, so the writer only inserts
them; this module needs no database, which keeps a worker process small. The store reads rows
back into records (`record_from_row`, for rebuilding trajectories) and documents into
trajectories (`trajectory_from_doc`).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

import orjson
import pyarrow as pa

from plumbline_otel.assemble import CONTEXT_ONLY, assembly_attributes
from plumbline_otel.model import RunEvent, SpanLink, SpanRecord, Step, ToolCallRef, ToolDecision, ToolResultRef, Trajectory
from plumbline_otel.shapes import SPANS, TRAJECTORIES

# The span columns (name -> DuckDB type, in table order), from their declaration in `shapes.py`: version 1's, and
# those each later migration appended (ALTER TABLE adds at the end).
SPAN_COLUMNS_V1: dict[str, str] = SPANS.duckdb_types(until=1)
SPAN_COLUMNS_V4: dict[str, str] = {c.name: c.duckdb_type for c in SPANS.added_in(4)}
SPAN_COLUMNS_V8: dict[str, str] = {c.name: c.duckdb_type for c in SPANS.added_in(8)}
SPAN_COLUMNS_V9: dict[str, str] = {c.name: c.duckdb_type for c in SPANS.added_in(9)}
SPAN_COLUMNS: dict[str, str] = SPANS.duckdb_types()


def _json(value: Any) -> bytes | None:
    """`value` as JSON text, as orjson's UTF-8 bytes: Arrow takes them for a string column as they are (checking
    they are UTF-8), where a `str` was decoded from them first, a copy and a check more for each value."""
    return None if value is None else orjson.dumps(value, default=str)


def _context(attributes: dict[str, Any]) -> dict[str, Any]:
    return assembly_attributes(attributes, CONTEXT_ONLY)


_SCHEMA: pa.Schema = SPANS.arrow()


def _resource_columns(records: list[SpanRecord]) -> tuple[list[bytes | None], list[bytes | None]]:
    """Each record's resource as JSON and its context (resource keys under the span's own), as JSON.

    The spans of one ResourceSpans share one resource dict: it is encoded and searched once.
    """
    resources: dict[int, tuple[bytes | None, dict[str, Any]]] = {}
    encoded: list[bytes | None] = []
    contexts: list[bytes | None] = []
    for rec in records:
        key = id(rec.resource)
        if key not in resources:
            resources[key] = (_json(rec.resource), _context(rec.resource))
        text, context = resources[key]
        own = _context(rec.attributes)
        merged = {**context, **own} if own else context
        encoded.append(text)
        contexts.append(_json(merged) if merged else None)
    return encoded, contexts


def span_table(records: list[SpanRecord], now: int) -> pa.Table:
    """Span records as the Arrow table the store inserts (built in the shard workers, off the writer).

    Built a column at a time, each a typed comprehension that mypyc compiles to field reads: no
    per-span row is made and transposed. Columns are named, so one missing from `SPAN_COLUMNS`'
    order fails here (KeyError) rather than shifting its neighbours.
    """
    resources, contexts = _resource_columns(records)
    columns: dict[str, list[Any]] = {
        "trace_id": [r.trace_id for r in records], "span_id": [r.span_id for r in records],
        "parent_span_id": [r.parent_span_id for r in records], "name": [r.name for r in records],
        "start_ns": [r.start_ns for r in records], "end_ns": [r.end_ns for r in records], "kind": [r.kind for r in records],
        "status_code": [r.status_code for r in records], "status_message": [r.status_message for r in records],
        "service_name": [r.service_name for r in records], "service_version": [r.service_version for r in records],
        "scope_name": [r.scope_name for r in records], "convention": [r.convention for r in records],
        "step_kind": [r.step_kind for r in records], "tool_name": [r.tool_name for r in records],
        "call_id": [r.call_id for r in records], "args": [_json(r.args) for r in records],
        "args_state": [r.args_state for r in records], "result": [_json(r.result) for r in records],
        "error": [r.error for r in records], "model": [r.model for r in records], "provider": [r.provider for r in records],
        "response_id": [r.response_id for r in records], "input_tokens": [r.input_tokens for r in records],
        "output_tokens": [r.output_tokens for r in records], "agent_name": [r.agent_name for r in records],
        "input_text": [r.input_text for r in records], "output_text": [r.output_text for r in records],
        "content_captured": [r.content_captured for r in records],
        "proposed_calls": [_json(r.proposed_calls) if r.proposed_calls else None for r in records],
        "tool_results": [_json(r.tool_results) if r.tool_results else None for r in records],
        "unknown_keys": [r.unknown_keys for r in records], "dropped_attributes_count": [r.dropped_attributes_count for r in records],
        "context": contexts, "attributes": [_json(r.attributes) for r in records], "resource": resources,
        "received_ns": [now] * len(records), "shapes": [r.shapes for r in records],
        "cache_read_tokens": [r.cache_read_tokens for r in records], "cache_write_tokens": [r.cache_write_tokens for r in records],
        "finish_reasons": [r.finish_reasons for r in records], "handoff_to": [r.handoff_to for r in records],
        "evidence": [r.evidence for r in records], "decisions": [_json(r.decisions) if r.decisions else None for r in records],
        "cost_amount": [r.cost_amount for r in records], "cost_currency": [r.cost_currency for r in records],
        "cost_source": [r.cost_source for r in records],
        "run_events": [_json(r.run_events) if r.run_events else None for r in records],
        "links": [_json(r.links) if r.links else None for r in records],
    }
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in _SCHEMA], schema=_SCHEMA)


_TRAJECTORY_SCHEMA: pa.Schema = TRAJECTORIES.arrow()
_TRAJECTORY_BATCH = 256  # trajectories turned into Arrow at a time: a long trace's thousands of runs are never all held


def trajectory_table(trajectories: Iterable[Trajectory], now: int) -> pa.Table:
    """Trajectories as the Arrow table the store inserts (built where they were assembled).

    Consumed a batch at a time, so an iterator of trajectories (`iter_runs`) is held as objects
    only a batch at a time.
    """
    batches, it = [], iter(trajectories)
    while batch := list(islice(it, _TRAJECTORY_BATCH)):
        batches.append(pa.record_batch([
            [t.trajectory_id for t in batch], [t.trace_id for t in batch], [t.task_key for t in batch],
            [t.task_key_source for t in batch], [t.service for t in batch], [t.service_version for t in batch],
            [t.agent_name for t in batch], [t.input for t in batch], [t.final_output for t in batch],
            [list(t.conventions) for t in batch], [t.start_ns for t in batch], [t.end_ns for t in batch],
            [len(t.steps) for t in batch], [len(t.tool_steps) for t in batch], [_json(_doc(t)) for t in batch],
            [now] * len(batch),
        ], schema=_TRAJECTORY_SCHEMA))
    return pa.Table.from_batches(batches, schema=_TRAJECTORY_SCHEMA)


def unique_spans(records: list[SpanRecord]) -> list[SpanRecord]:
    """The first copy of each span, as the store keeps it (later copies were ignored)."""
    seen: dict[str, SpanRecord] = {}
    for rec in records:
        seen.setdefault(rec.span_id, rec)
    return list(seen.values()) if len(seen) < len(records) else records


def record_from_row(row: dict[str, Any], keys: list[str], key_values: list[Any]) -> SpanRecord:
    for name in ("args", "result"):
        row[name] = orjson.loads(row[name]) if row[name] is not None else None
    row["proposed_calls"] = [ToolCallRef(**c) for c in orjson.loads(row["proposed_calls"])] if row["proposed_calls"] else []
    row["tool_results"] = [ToolResultRef(**r) for r in orjson.loads(row["tool_results"])] if row["tool_results"] else []
    row["unknown_keys"] = row["unknown_keys"] or []
    for name in ("shapes", "finish_reasons", "evidence"):
        row[name] = row[name] or []
    row["decisions"] = [ToolDecision(**d) for d in orjson.loads(row["decisions"])] if row["decisions"] else []
    row["run_events"] = [RunEvent(**e) for e in orjson.loads(row["run_events"])] if row["run_events"] else []
    row["links"] = [SpanLink(**link) for link in orjson.loads(row["links"])] if row["links"] else []
    context_json = row.pop("context")
    context = orjson.loads(context_json) if context_json else {}
    attributes = {k: v for k, v in zip(keys, key_values or []) if v is not None}
    attributes.update(context)
    return SpanRecord(**row, attributes=attributes)


def _doc(t: Trajectory) -> dict[str, Any]:
    doc = t.export()
    doc["steps"] = [
        {**s.export(), "span_id": s.span_id, "start_ns": s.start_ns, "model": s.model,
         "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "cache_read_tokens": s.cache_read_tokens,
         "cache_write_tokens": s.cache_write_tokens, "finish_reasons": list(s.finish_reasons), "evidence": s.evidence,
         "gaps": list(s.gaps), "cost_amount": s.cost_amount, "cost_currency": s.cost_currency, "cost_source": s.cost_source}
        for s in t.steps
    ]
    return doc


def trajectory_from_doc(doc: dict[str, Any]) -> Trajectory:
    """A trajectory from its stored (or exported) JSON document."""
    fields_of = Step.__dataclass_fields__
    steps = tuple(Step(**{k: tuple(v) if k in ("finish_reasons", "gaps") else v for k, v in s.items() if k in fields_of})  # type: ignore[arg-type]
                  for s in doc["steps"])
    fields = {k: v for k, v in doc.items() if k in Trajectory.__dataclass_fields__ and k != "steps"}
    fields["conventions"] = tuple(fields.get("conventions") or ())
    return Trajectory(**fields, steps=steps)
