"""Coverage: what the stored traffic can and cannot support, in numbers and in sentences.

Every figure is SQL over the store. The sentences name the gap, the analysis it rules out and,
where there is one, what the user can change (usually a content-capture switch in their
instrumentation).

The report is made in two steps so that several stores read as one: `coverage_counts` gives only
figures that add up across stores holding different traces (per-task run counts instead of a
distinct-task count, every unrecognised key instead of the top 25), and `report_from_counts`
derives the rest (task figures, the top keys, the sentences) once, from the summed counts.
"""

from __future__ import annotations

from typing import Any, Sequence

from plumbline_otel.store import Store

_STEPS = """
    SELECT t.service AS service, s.value AS step
    FROM trajectories t, LATERAL (SELECT unnest(from_json(json_extract(t.doc, '$.steps'), '["json"]')) AS value) s
    WHERE {where}
"""


def _one(store: Store, sql: str, params: list[Any]) -> dict[str, Any]:
    cursor = store.connection.cursor()
    cursor.execute(sql, params)
    row = cursor.fetchone()
    names = [d[0] for d in cursor.description]
    return {n: (v if v is not None else 0) for n, v in zip(names, row or [None] * len(names))}


def _filter(service: str | None, since_ns: int | None, service_col: str, time_col: str,
            exclude: Sequence[str] = (), trace_col: str = "trace_id") -> tuple[str, list[Any]]:
    clauses, params = ["TRUE"], []
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


def _spans(store: Store, where: str, params: list[Any]) -> dict[str, Any]:
    by_convention = store.connection.execute(
        f"SELECT convention, count(*), count(DISTINCT trace_id) FROM spans WHERE {where} GROUP BY 1", params
    ).fetchall()
    totals = _one(store, f"""
        SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces,
               count(*) FILTER (step_kind = 'tool_call') AS tool_spans,
               count(*) FILTER (step_kind = 'tool_call' AND args_state IN ('absent', 'redacted')) AS tool_spans_without_args,
               count(*) FILTER (step_kind = 'llm_call') AS llm_spans,
               count(*) FILTER (dropped_attributes_count > 0) AS spans_with_dropped_attributes
        FROM spans WHERE {where}""", params)
    totals["by_convention"] = {c: {"spans": n, "traces": t} for c, n, t in by_convention}
    return totals


def _tool_calls(store: Store, where: str, params: list[Any]) -> dict[str, Any]:
    steps = _STEPS.format(where=where)
    stats = _one(store, f"""
        WITH steps AS ({steps})
        SELECT count(*) AS tool_calls,
               count(*) FILTER (json_type(step, '$.args') = 'OBJECT') AS with_structured_args,
               count(*) FILTER (json_type(step, '$.result') IS NOT NULL AND json_type(step, '$.result') <> 'NULL') AS with_results,
               count(*) FILTER (json_extract_string(step, '$.call_id') IS NOT NULL) AS with_call_ids,
               count(*) FILTER (json_extract_string(step, '$.error') IS NOT NULL) AS failed,
               count(*) FILTER (json_extract_string(step, '$.source') = 'llm_output') AS only_in_llm_output,
               count(*) FILTER (json_extract_string(step, '$.source') = 'tool_span+llm_output') AS tool_span_matched_to_llm_output
        FROM steps WHERE json_extract_string(step, '$.kind') = 'tool_call'""", params)
    recovered = _one(store, f"""
        WITH steps AS ({steps})
        SELECT count(*) AS args_recovered_from_llm_output
        FROM steps JOIN spans p ON p.span_id = json_extract_string(step, '$.span_id')
        WHERE json_extract_string(step, '$.kind') = 'tool_call' AND p.args_state IN ('absent', 'redacted')
          AND json_type(step, '$.args') = 'OBJECT'""", params)
    stats.update(recovered)
    return stats


def _llm_calls(store: Store, where: str, params: list[Any]) -> dict[str, Any]:
    """LLM calls after merging the same call traced twice; the merged step keeps the richest span."""
    return _one(store, f"""
        WITH steps AS ({_STEPS.format(where=where)})
        SELECT count(*) AS llm_calls,
               count(*) FILTER (p.content_captured) AS with_content,
               count(*) FILTER (p.input_tokens IS NOT NULL OR p.output_tokens IS NOT NULL) AS with_tokens
        FROM steps JOIN spans p ON p.span_id = json_extract_string(step, '$.span_id')
        WHERE json_extract_string(step, '$.kind') = 'llm_call'""", params)


def _trajectories(store: Store, where: str, params: list[Any]) -> dict[str, Any]:
    counts = _one(store, f"""
        SELECT count(*) AS trajectories,
               count(*) FILTER (input IS NOT NULL) AS with_input,
               count(*) FILTER (final_output IS NOT NULL) AS with_final_output,
               count(*) FILTER (task_key_source LIKE 'attribute:%') AS task_key_from_attribute,
               count(*) FILTER (task_key_source = 'input_hash') AS task_key_from_input_hash,
               count(*) FILTER (task_key_source = 'none') AS without_task_key
        FROM trajectories WHERE {where}""", params)
    counts["task_runs"] = dict(store.connection.execute(
        f"SELECT task_key, count(*) FROM trajectories WHERE {where} AND task_key IS NOT NULL GROUP BY 1", params).fetchall())
    return counts


def _unknown_keys(store: Store, where: str, params: list[Any]) -> dict[str, int]:
    rows = store.connection.execute(f"""
        SELECT key, count(*) FROM (SELECT unnest(unknown_keys) AS key FROM spans WHERE {where}) GROUP BY 1""", params).fetchall()
    return dict(rows)


def _section_counts(store: Store, service: str | None, since_ns: int | None, exclude: Sequence[str]) -> dict[str, Any]:
    span_where, span_params = _filter(service, since_ns, "service_name", "start_ns", exclude)
    traj_where, traj_params = _filter(service, since_ns, "service", "start_ns", exclude)
    steps_where = _filter(service, since_ns, "t.service", "t.start_ns", exclude, "t.trace_id")[0]
    return {
        "spans": _spans(store, span_where, span_params),
        "tool_calls": _tool_calls(store, steps_where, traj_params),
        "llm_calls": _llm_calls(store, steps_where, traj_params),
        "trajectories": _trajectories(store, traj_where, traj_params),
        "unrecognised_keys": _unknown_keys(store, span_where, span_params),
    }


def _section(counts: dict[str, Any]) -> dict[str, Any]:
    """A report section from its counts: task figures from the per-task runs, the top 25 keys, the sentences."""
    section = dict(counts)
    trajectories = dict(counts["trajectories"])
    task_runs = trajectories.pop("task_runs")
    trajectories["tasks"] = len(task_runs)
    trajectories["tasks_seen_more_than_once"] = sum(1 for n in task_runs.values() if n > 1)
    section["trajectories"] = trajectories
    spans = dict(counts["spans"])
    spans["by_convention"] = dict(sorted(spans["by_convention"].items(), key=lambda kv: (-kv[1]["spans"], str(kv[0]))))
    section["spans"] = spans
    section["unrecognised_keys"] = dict(sorted(counts["unrecognised_keys"].items(), key=lambda kv: (-kv[1], kv[0]))[:25])
    section["findings"] = findings(section)
    return section


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def findings(section: dict[str, Any]) -> list[str]:
    """Plain sentences: each gap, what it rules out, and what to change."""
    spans, tools, trajs, llm_calls = section["spans"], section["tool_calls"], section["trajectories"], section["llm_calls"]
    out: list[str] = []
    n_tools = tools["tool_calls"]
    no_args = n_tools - tools["with_structured_args"]
    if spans["spans"] == 0:
        return ["No spans stored yet: ingest trace files or point an OTLP exporter at `plumbline serve`."]
    if n_tools == 0:
        out.append("No tool calls found: neither tool spans nor tool calls in LLM output messages; conformance and consistency have nothing to check.")
    elif no_args:
        out.append(f"{_pct(no_args, n_tools)} of tool calls ({no_args} of {n_tools}) carry no structured arguments, so argument invariants (arg_equals, arg_satisfies) are unavailable for them.")
    if spans["tool_spans_without_args"]:
        recovered = tools["args_recovered_from_llm_output"]
        out.append(f"{spans['tool_spans_without_args']} tool spans carry no arguments; {recovered} of them were recovered from the parent LLM span's output messages.")
    if tools["only_in_llm_output"]:
        out.append(f"{tools['only_in_llm_output']} tool calls exist only in LLM output messages (no tool spans): their results come from later LLM inputs, and a call the agent never executed cannot be told apart from one that ran.")
    llm, content = llm_calls["llm_calls"], llm_calls["with_content"]
    if spans["llm_spans"] > llm:
        out.append(f"{spans['llm_spans'] - llm} LLM spans describe a call another span already records (a provider SDK's own span beside an instrumentation's); each such call counts once.")
    if llm and content < llm:
        out.append(f"{_pct(llm - content, llm)} of LLM calls ({llm - content} of {llm}) have no message content: content capture is off by default in most instrumentations (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT for the OpenTelemetry GenAI ones); without it, tool calls inside LLM spans and the run's input are invisible.")
    if llm and llm_calls["with_tokens"] < llm:
        out.append(f"{llm - llm_calls['with_tokens']} of {llm} LLM calls report no token usage, so cost figures undercount.")
    n = trajs["trajectories"]
    if n and trajs["with_input"] < n:
        out.append(f"{n - trajs['with_input']} of {n} trajectories have no recorded input, so they cannot be replayed.")
    if n and trajs["task_key_from_attribute"] < n:
        out.append(f"{n - trajs['task_key_from_attribute']} of {n} trajectories have no task-key attribute (session.id, gen_ai.conversation.id or --task-key); they are grouped by a hash of their input, which splits a task whose input is reworded.")
    if n and trajs["tasks_seen_more_than_once"] == 0:
        out.append("No task was seen more than once, so consistency (agreement across runs of one task) cannot be measured yet.")
    if spans["spans_with_dropped_attributes"]:
        out.append(f"{spans['spans_with_dropped_attributes']} spans lost attributes (dropped_attributes_count > 0): an SDK attribute limit or a rejected value; long message lists may be cut.")
    if section["unrecognised_keys"]:
        keys = ", ".join(list(section["unrecognised_keys"])[:5])
        out.append(f"Unrecognised keys on GenAI-looking spans (kept raw, not interpreted): {keys}.")
    return out


def coverage_counts(store: Store, since_ns: int | None = None, exclude_traces: Sequence[str] = ()) -> dict[str, Any]:
    """The additive form of the report: counts of several stores holding different traces sum to
    the counts of one store holding them all (`report_from_counts` turns them into the report).
    `exclude_traces` leaves traces out (pieces of a trace another store also holds)."""
    services = [r[0] for r in store.connection.execute("SELECT DISTINCT service_name FROM spans ORDER BY 1 NULLS LAST").fetchall()]
    return {
        "version": 1,
        "form": "counts",
        "overall": _section_counts(store, None, since_ns, exclude_traces),
        "services": {str(s): _section_counts(store, s, since_ns, exclude_traces) for s in services},
        "rejected_input": _one(store, "SELECT count(*) AS problems, coalesce(sum(spans), 0) AS rejected_spans FROM problems", []),
    }


def report_from_counts(counts: dict[str, Any]) -> dict[str, Any]:
    """The report from (possibly summed) counts: overall, per service when there are several, rejected input."""
    services = dict(sorted(counts["services"].items(), key=lambda kv: (kv[0] == "None", kv[0])))
    return {
        "version": counts["version"],
        "overall": _section(counts["overall"]),
        "services": {name: _section(c) for name, c in services.items()} if len(services) > 1 else {},
        "rejected_input": counts["rejected_input"],
    }


def coverage_report(store: Store, since_ns: int | None = None) -> dict[str, Any]:
    """The whole report: overall, per service, and the input rejected on the way in."""
    return report_from_counts(coverage_counts(store, since_ns))


def render_text(report: dict[str, Any]) -> str:
    """The report as a person reads it: headline counts, then the findings."""
    lines: list[str] = []
    for title, section in [("All traffic", report["overall"]), *report["services"].items()]:
        spans, tools, trajs, llm = section["spans"], section["tool_calls"], section["trajectories"], section["llm_calls"]
        conventions = ", ".join(f"{c} {v['spans']}" for c, v in spans["by_convention"].items())
        lines += [
            f"== {title} ==",
            f"spans {spans['spans']} in {spans['traces']} traces ({conventions})",
            f"tool calls {tools['tool_calls']}: structured args {_pct(tools['with_structured_args'], tools['tool_calls'])}, "
            f"results {_pct(tools['with_results'], tools['tool_calls'])}, call ids {_pct(tools['with_call_ids'], tools['tool_calls'])}, "
            f"failed {tools['failed']}",
            f"LLM calls {llm['llm_calls']} (from {spans['llm_spans']} spans): content {_pct(llm['with_content'], llm['llm_calls'])}, "
            f"token usage {_pct(llm['with_tokens'], llm['llm_calls'])}",
            f"trajectories {trajs['trajectories']}: input {_pct(trajs['with_input'], trajs['trajectories'])}, "
            f"final output {_pct(trajs['with_final_output'], trajs['trajectories'])}, tasks {trajs['tasks']} "
            f"({trajs['tasks_seen_more_than_once']} seen more than once)",
            *(f"- {f}" for f in section["findings"]),
            "",
        ]
    rejected = report["rejected_input"]
    if rejected["problems"]:
        lines.append(f"Rejected on the way in: {rejected['problems']} problems, {rejected['rejected_spans']} spans (see `plumbline ingest` output).")
    return "\n".join(lines).rstrip() + "\n"
