"""The coverage report's figures, as SQL over the store: what the stored traffic can and cannot support, in counts.

Only figures that add up across stores holding different traces (per-task run counts instead of a
distinct-task count, every unrecognised key instead of the top 25): `coverage.report_from_counts`
derives the rest, and the sentences, once from the (summed) counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Reader(Protocol):
    """What the coverage queries need of `_read.Reader` (which imports this module, so it is not imported here)."""

    connection: Any
    schema_version: int

_STEPS = """
    SELECT t.service AS service, s.value AS step
    FROM trajectories t, LATERAL (SELECT unnest(from_json(json_extract(t.doc, '$.steps'), '["json"]')) AS value) s
    WHERE {where}
"""


def _one(reader: Reader, sql: str, params: list[Any]) -> dict[str, Any]:
    cursor = reader.connection.cursor()
    cursor.execute(sql, params)
    row = cursor.fetchone()
    names = [d[0] for d in cursor.description]
    return {n: (v if v is not None else 0) for n, v in zip(names, row or [None] * len(names))}


def _filter(service: str | None, since_ns: int | None, service_col: str, time_col: str,
            exclude: Sequence[str] = (), trace_col: str = "trace_id") -> tuple[str, list[Any]]:
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []
    if service is not None:
        clauses.append(f"{service_col} IS NOT DISTINCT FROM ?")
        params.append(service)
    if since_ns is not None:
        clauses.append(f"{time_col} >= ?")
        params.append(since_ns)
    if exclude:
        clauses.append(f"NOT list_contains(?::VARCHAR[], {trace_col})")
        params.append(list(exclude))
    return " AND ".join(clauses), params


def _spans(reader: Reader, where: str, params: list[Any]) -> dict[str, Any]:
    by_convention = reader.connection.execute(
        f"SELECT convention, count(*), count(DISTINCT trace_id) FROM spans WHERE {where} GROUP BY 1", params
    ).fetchall()
    totals = _one(reader, f"""
        SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces,
               count(*) FILTER (step_kind = 'tool_call') AS tool_spans,
               count(*) FILTER (step_kind = 'tool_call' AND args_state IN ('absent', 'redacted')) AS tool_spans_without_args,
               count(*) FILTER (step_kind = 'llm_call') AS llm_spans,
               count(*) FILTER (dropped_attributes_count > 0) AS spans_with_dropped_attributes
        FROM spans WHERE {where}""", params)
    totals["by_convention"] = {c: {"spans": n, "traces": t} for c, n, t in by_convention}
    totals["by_scope"] = dict(reader.connection.execute(
        f"SELECT coalesce(scope_name, ''), count(*) FROM spans WHERE {where} GROUP BY 1", params).fetchall())
    totals.update(_bug_signatures(reader, where, params))
    return totals


def _bug_signatures(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    """Signatures of instrumentation bugs: a tool or model span alone in its trace with no agent (the parent context
    was lost: every span its own trace); spans whose parent never arrived (a span never ended is never exported); a
    LangChain instrumentation's spans all under one parent, its chain spans holding none of its model and tool spans
    (the callback manager's parent spans lost: a flat tree); tool spans named by the tool's class (normalise marks
    them `step:tool_named_by_class`)."""
    by_class = "list_contains(shapes, 'step:tool_named_by_class')" if reader.schema_version >= 3 else "FALSE"
    return _one(reader, f"""
        WITH s AS (SELECT trace_id, span_id, parent_span_id, step_kind, scope_name, {by_class} AS by_class FROM spans WHERE {where}),
             per_trace AS (SELECT trace_id, count(*) AS n, bool_or(step_kind IN ('tool_call', 'llm_call')) AS has_step,
                                  bool_or(step_kind = 'agent') AS has_agent FROM s GROUP BY 1),
             flat AS (SELECT trace_id FROM s WHERE scope_name ILIKE '%langchain%' GROUP BY 1
                      HAVING count(DISTINCT coalesce(parent_span_id, '')) = 1 AND bool_or(step_kind = 'other')
                         AND bool_or(step_kind IN ('tool_call', 'llm_call')))
        SELECT (SELECT count(*) FROM per_trace WHERE n = 1 AND has_step AND NOT has_agent) AS lone_step_traces,
               (SELECT count(*) FROM s WHERE parent_span_id IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM s p WHERE p.trace_id = s.trace_id AND p.span_id = s.parent_span_id)) AS spans_without_parent,
               (SELECT count(*) FROM flat) AS flat_langchain_traces,
               (SELECT count(*) FROM s WHERE by_class) AS tool_spans_named_by_class
        """, params)


def _tool_calls(reader: Reader, where: str, params: list[Any]) -> dict[str, Any]:
    steps = _STEPS.format(where=where)
    stats = _one(reader, f"""
        WITH steps AS ({steps})
        SELECT count(*) AS tool_calls,
               count(*) FILTER (json_type(step, '$.args') = 'OBJECT') AS with_structured_args,
               count(*) FILTER (json_type(step, '$.result') IS NOT NULL AND json_type(step, '$.result') <> 'NULL') AS with_results,
               count(*) FILTER (json_extract_string(step, '$.call_id') IS NOT NULL) AS with_call_ids,
               count(*) FILTER (json_extract_string(step, '$.error') IS NOT NULL) AS failed,
               count(*) FILTER (json_extract_string(step, '$.source') = 'llm_output') AS only_in_llm_output,
               count(*) FILTER (json_extract_string(step, '$.source') = 'tool_span+llm_output') AS tool_span_matched_to_llm_output
        FROM steps WHERE json_extract_string(step, '$.kind') = 'tool_call'""", params)
    recovered = _one(reader, f"""
        WITH steps AS ({steps})
        SELECT count(*) AS args_recovered_from_llm_output
        FROM steps JOIN spans p ON p.span_id = json_extract_string(step, '$.span_id')
        WHERE json_extract_string(step, '$.kind') = 'tool_call' AND p.args_state IN ('absent', 'redacted')
          AND json_type(step, '$.args') = 'OBJECT'""", params)
    stats.update(recovered)
    stats.update(_one(reader, f"""
        WITH steps AS ({steps})
        SELECT count(*) AS bare_args_replaced_by_llm_output
        FROM steps JOIN spans p ON p.span_id = json_extract_string(step, '$.span_id')
        WHERE json_extract_string(step, '$.kind') = 'tool_call' AND p.args_state = 'unparsed'
          AND json_type(step, '$.args') = 'OBJECT'""", params))
    return stats


def _evidence(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    """Where each tool call's evidence came from: its own span, an LLM span's output, or both."""
    rows = reader.connection.execute(f"""
        WITH steps AS ({_STEPS.format(where=where)})
        SELECT json_extract_string(step, '$.source'), count(*) FROM steps
        WHERE json_extract_string(step, '$.kind') = 'tool_call' GROUP BY 1 ORDER BY 2 DESC, 1""", params).fetchall()
    return dict(rows)


def _step_evidence(reader: Reader, where: str, params: list[Any]) -> dict[str, dict[str, int]]:
    """Per step kind, where its evidence came from (a tool call's arguments, an LLM call's content); "none" when none.

    Trajectories assembled before steps recorded their evidence (read-only older files) count as "unknown".
    """
    rows = reader.connection.execute(f"""
        WITH steps AS ({_STEPS.format(where=where)})
        SELECT json_extract_string(step, '$.kind') AS kind,
               CASE WHEN json_type(step, '$.gaps') IS NULL THEN 'unknown'
                    ELSE coalesce(json_extract_string(step, '$.evidence'), 'none') END AS evidence, count(*)
        FROM steps WHERE json_extract_string(step, '$.kind') IN ('tool_call', 'llm_call')
        GROUP BY 1, 2 ORDER BY 3 DESC, 2""", params).fetchall()
    out: dict[str, dict[str, int]] = {"tool_call": {}, "llm_call": {}}
    for kind, evidence, n in rows:
        out[kind][evidence] = n
    return out


def _gaps(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    """Why values are missing, per "<field>:<reason>" (reasons: content_capture_off, attribute_absent, unknown_key:<key>)."""
    rows = reader.connection.execute(f"""
        WITH steps AS ({_STEPS.format(where=where)})
        SELECT gap, count(*) FROM (SELECT unnest(from_json(json_extract(step, '$.gaps'), '["varchar"]')) AS gap FROM steps)
        GROUP BY 1 ORDER BY 2 DESC, 1""", params).fetchall()
    return dict(rows)


def _log_records(reader: Reader, service: str | None) -> dict[str, int]:
    """GenAI log records stored, and how many name no stored span (their content is in no trajectory yet)."""
    if reader.schema_version < 4:  # no logs table before version 4 (opened read-only)
        return {"records": 0, "without_span": 0}
    clause, params = ("WHERE l.service_name IS NOT DISTINCT FROM ?", [service]) if service is not None else ("", [])
    return _one(reader, f"""
        SELECT count(*) AS records,
               count(*) FILTER (NOT EXISTS (SELECT 1 FROM spans s WHERE s.trace_id = l.trace_id AND s.span_id = l.span_id)) AS without_span
        FROM logs l {clause}""", params)


def _shapes(reader: Reader, where: str, params: list[Any]) -> dict[str, dict[str, int]]:
    """Framework wrappers and dumps met per span: recognised (and unwrapped) or kept as they came."""
    if reader.schema_version < 3:  # written before spans recorded their shapes, opened read-only
        return {"unwrapped": {}, "kept_as_is": {}}
    rows = reader.connection.execute(f"""
        SELECT shape, count(*) FROM (SELECT unnest(shapes) AS shape FROM spans WHERE {where})
        GROUP BY 1 ORDER BY 2 DESC, 1""", params).fetchall()
    kept = {shape: n for shape, n in rows if shape.endswith((":unrecognised", ":scalar"))}
    return {"unwrapped": {shape: n for shape, n in rows if shape not in kept}, "kept_as_is": kept}


def _llm_calls(reader: Reader, where: str, params: list[Any]) -> dict[str, Any]:
    """LLM calls after merging the same call traced twice; the merged step keeps the richest span."""
    return _one(reader, f"""
        WITH steps AS ({_STEPS.format(where=where)})
        SELECT count(*) AS llm_calls,
               count(*) FILTER (p.content_captured OR json_extract_string(step, '$.evidence') IS NOT NULL) AS with_content,
               count(*) FILTER (p.input_tokens IS NOT NULL OR p.output_tokens IS NOT NULL) AS with_tokens
        FROM steps JOIN spans p ON p.span_id = json_extract_string(step, '$.span_id')
        WHERE json_extract_string(step, '$.kind') = 'llm_call'""", params)


def _trajectories(reader: Reader, where: str, params: list[Any]) -> dict[str, Any]:
    counts = _one(reader, f"""
        WITH t AS (SELECT * FROM trajectories WHERE {where})
        SELECT count(*) AS trajectories,
               count(*) FILTER (input IS NOT NULL) AS with_input,
               count(*) FILTER (final_output IS NOT NULL) AS with_final_output,
               count(*) FILTER (task_key_source LIKE 'attribute:%') AS task_key_from_attribute,
               count(*) FILTER (task_key_source = 'input_hash') AS task_key_from_input_hash,
               count(*) FILTER (task_key_source = 'none') AS without_task_key,
               count(*) FILTER (json_extract_string(doc, '$.context."session.id"') IS NOT NULL
                                OR json_extract_string(doc, '$.context."gen_ai.conversation.id"') IS NOT NULL) AS with_session_or_conversation_id,
               (SELECT count(*) FROM (SELECT trace_id FROM t GROUP BY 1 HAVING count(*) > 1)) AS traces_with_several_runs
        FROM t""", params)
    counts["task_runs"] = dict(reader.connection.execute(
        f"SELECT task_key, count(*) FROM trajectories WHERE {where} AND task_key IS NOT NULL GROUP BY 1", params).fetchall())
    counts.update(_joined_runs(reader, where, params))
    return counts


def _joined_runs(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    """Runs assembled from traces of one model call each, joined by the conversation each request continues
    (`threads.py`), and their model calls (one per such trace)."""
    if reader.schema_version < 10:  # no conversation keys before version 10 (opened read-only)
        return {"joined_runs": 0, "joined_traces": 0}
    return _one(reader, f"""
        WITH links AS (SELECT l.trace_id, l.linked_trace_id FROM trace_links l
                       WHERE l.trace_id IN (SELECT trace_id FROM conversation_keys)
                         AND l.linked_trace_id IN (SELECT trace_id FROM conversation_keys)),
             joined AS (SELECT trace_id FROM links UNION SELECT linked_trace_id FROM links),
             t AS (SELECT doc FROM trajectories WHERE {where} AND trace_id IN (SELECT trace_id FROM joined))
        SELECT count(*) AS joined_runs,
               coalesce(sum((SELECT count(*) FROM (SELECT unnest(from_json(json_extract(doc, '$.steps'), '["json"]')) AS step)
                             WHERE json_extract_string(step, '$.kind') = 'llm_call')), 0) AS joined_traces
        FROM t""", params)


def _task_key_sources(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    rows = reader.connection.execute(
        f"SELECT task_key_source, count(*) FROM trajectories WHERE {where} GROUP BY 1 ORDER BY 2 DESC, 1", params).fetchall()
    return dict(rows)


def _unknown_keys(reader: Reader, where: str, params: list[Any]) -> dict[str, int]:
    rows = reader.connection.execute(f"""
        SELECT key, count(*) FROM (SELECT unnest(unknown_keys) AS key FROM spans WHERE {where}) GROUP BY 1""", params).fetchall()
    return dict(rows)


def _section_counts(reader: Reader, service: str | None, since_ns: int | None, exclude: Sequence[str]) -> dict[str, Any]:
    span_where, span_params = _filter(service, since_ns, "service_name", "start_ns", exclude)
    traj_where, traj_params = _filter(service, since_ns, "service", "start_ns", exclude)
    step_where = _filter(service, since_ns, "t.service", "t.start_ns", exclude, "t.trace_id")[0]
    return {
        "spans": _spans(reader, span_where, span_params),
        "tool_calls": _tool_calls(reader, step_where, traj_params),
        "llm_calls": _llm_calls(reader, step_where, traj_params),
        "trajectories": _trajectories(reader, traj_where, traj_params),
        "evidence_sources": _evidence(reader, step_where, traj_params),
        "step_evidence": _step_evidence(reader, step_where, traj_params),
        "gaps": _gaps(reader, step_where, traj_params),
        "log_records": _log_records(reader, service),
        "task_key_sources": _task_key_sources(reader, traj_where, traj_params),
        "shapes": _shapes(reader, span_where, span_params),
        "unrecognised_keys": _unknown_keys(reader, span_where, span_params),
    }


def coverage_counts(reader: Reader, since_ns: int | None, exclude_traces: Sequence[str]) -> dict[str, Any]:
    """The additive form of the report: counts of several stores holding different traces sum to
    the counts of one store holding them all (`coverage.report_from_counts` turns them into the report).
    `exclude_traces` leaves traces out (pieces of a trace another store also holds)."""
    services = [r[0] for r in reader.connection.execute("SELECT DISTINCT service_name FROM spans ORDER BY 1 NULLS LAST").fetchall()]
    return {
        "version": 1,
        "form": "counts",
        "overall": _section_counts(reader, None, since_ns, exclude_traces),
        "services": {str(s): _section_counts(reader, s, since_ns, exclude_traces) for s in services},
        "rejected_input": _one(reader, "SELECT count(*) AS problems, coalesce(sum(spans), 0) AS rejected_spans FROM problems", []),
    }
