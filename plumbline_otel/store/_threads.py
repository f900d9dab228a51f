"""The store's side of `plumbline_otel/threads.py`: a span batch's root model calls keyed, the keys kept in
`conversation_keys` (schema version 10), and each trace linked in `trace_links` to the trace whose conversation its
request continues, so `Store.assemble` builds the traces of one run together (issue 40 item 12)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plumbline_otel.normalise import maybe_json
from plumbline_otel.threads import KEY_COLUMNS, NEW_TURN, ThreadKeys, keys_of_attributes


def keyed_calls(batch: pa.Table) -> pa.Table | None:
    """The conversation keys (`KEY_COLUMNS`) of a span batch's root model calls (a `rows.span_table`), for the store's
    `conversation_keys`; None when it holds none. A model call under any other span (an agent's, a run's, the app's)
    is part of that trace's run already and is not keyed."""
    roots = batch.filter(pc.and_(pc.is_null(batch["parent_span_id"]), pc.equal(batch["step_kind"], "llm_call")))
    if not roots.num_rows:
        return None
    rows: dict[str, list[Any]] = {name: [] for name in KEY_COLUMNS}
    for row in roots.select(["trace_id", "span_id", "start_ns", "end_ns", "attributes", "shapes"]).to_pylist():
        attributes = maybe_json(row["attributes"]) if row["attributes"] else None
        keys = keys_of_attributes(attributes) if isinstance(attributes, dict) else None
        if keys is None:
            continue
        if NEW_TURN in (row["shapes"] or []):  # it opens a run of its own (assembly's rule 6): it continues none
            keys = ThreadKeys(None, None, keys.after, keys.after_loose)
        for name in ("trace_id", "span_id", "start_ns", "end_ns"):
            rows[name].append(row[name])
        for name in KEY_COLUMNS[4:]:
            rows[name].append(getattr(keys, name))
    if not rows["trace_id"]:
        return None
    return pa.table({name: pa.array(values, pa.int64() if name.endswith("_ns") else pa.string()) for name, values in rows.items()})


# Keep a batch's keys (`keyed_calls`, registered as `thread_batch`) and link its traces to the traces they continue and
# that continue them, as `continuation_links` does, in `trace_links` (traces linked there are assembled together).
KEYS_SQL = f"INSERT OR IGNORE INTO conversation_keys SELECT {', '.join(KEY_COLUMNS)} FROM thread_batch"
LINK_SQL = """INSERT OR IGNORE INTO trace_links SELECT trace_id, min(linked_trace_id) FROM (
    SELECT b.trace_id, b.span_id, a.trace_id AS linked_trace_id, (b.continues = a.after) AS strict,
           bool_or(b.continues = a.after) OVER (PARTITION BY b.trace_id, b.span_id) AS any_strict
    FROM conversation_keys b JOIN conversation_keys a ON b.continues_loose = a.after_loose
    WHERE a.trace_id <> b.trace_id AND a.end_ns <= b.start_ns
      AND (b.trace_id IN (SELECT trace_id FROM thread_batch) OR a.trace_id IN (SELECT trace_id FROM thread_batch)))
    WHERE strict = any_strict GROUP BY trace_id, span_id HAVING count(DISTINCT linked_trace_id) = 1"""
