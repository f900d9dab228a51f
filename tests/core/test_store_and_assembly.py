"""Store and assembly: idempotent writes, any arrival order, one step per call, task keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp import record, to_otlp_json

from core.spans import genai_run
from plumbline_otel.assemble import assemble_runs, assembly_keys, trim_for_assembly
from plumbline_otel.cli.main import cli
from plumbline_otel.coverage import coverage_report
from plumbline_otel.errors import StoreError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.normalise import normalise_request
from plumbline_otel.rows import SPAN_COLUMNS_V8, SPAN_COLUMNS_V9
from plumbline_otel.store import SCHEMA_VERSION, Store


def _split(request: ExportTraceServiceRequest, parts: int) -> list[ExportTraceServiceRequest]:
    """The spans of one request spread over several requests, last spans first (out of order)."""
    spans = list(request.resource_spans[0].scope_spans[0].spans)[::-1]
    out = []
    for i in range(parts):
        piece = ExportTraceServiceRequest()
        piece.resource_spans.add().CopyFrom(request.resource_spans[0])
        del piece.resource_spans[0].scope_spans[0].spans[:]
        piece.resource_spans[0].scope_spans[0].spans.extend(spans[i::parts])
        out.append(piece)
    return out


def _write(path: Path, requests: list[ExportTraceServiceRequest]) -> Path:
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in requests))
    return path


def test_tool_spans_and_model_proposals_are_one_step_per_call(store: Store, tmp_path: Path) -> None:
    ingest_files(store, [str(_write(tmp_path / "a.jsonl", [record(genai_run)]))])
    [t] = list(store.trajectories())
    assert [(s.name, s.source) for s in t.tool_steps] == [
        ("get_invoice", "tool_span+llm_output"), ("schedule_payment", "tool_span+llm_output")]
    assert [s.kind for s in t.steps] == ["llm_call", "tool_call", "llm_call", "tool_call"]
    assert (t.task_key_source, t.input, t.final_output) == ("input_hash", "Pay invoice INV-1029", "Paid 4820.00 EUR")
    assert t.context["gen_ai.conversation.id"] == "INV-1029"  # a conversation is not a task: kept in context
    assert t.tool_steps[0].result == {"amount": 4820.0}


def test_without_tool_spans_the_proposed_calls_are_the_steps_with_results_paired_by_id(store: Store, tmp_path: Path) -> None:
    ingest_files(store, [str(_write(tmp_path / "a.jsonl", [record(lambda t: genai_run(t, tool_spans=False))]))])
    [t] = list(store.trajectories())
    assert [(s.name, s.args, s.source) for s in t.tool_steps] == [
        ("get_invoice", {"invoice_id": "INV-1029"}, "llm_output"),
        ("schedule_payment", {"invoice_id": "INV-1029", "amount": 4820.0}, "llm_output")]
    assert t.tool_steps[0].result == {"amount": 4820.0}  # carried on a `user` message as `result`
    assert t.tool_steps[1].result is None


def test_a_failed_call_is_marked_on_its_step(store: Store, tmp_path: Path) -> None:
    ingest_files(store, [str(_write(tmp_path / "a.jsonl", [record(lambda t: genai_run(t, fail_second=True))]))])
    [t] = list(store.trajectories())
    assert [s.error for s in t.tool_steps] == [None, "503 upstream unavailable"]


def test_spans_split_across_files_out_of_order_with_duplicates_make_one_trajectory(store: Store, tmp_path: Path) -> None:
    whole = record(genai_run)
    first, second, third = _split(whole, 3)
    summary = ingest_files(store, [str(_write(tmp_path / "1.jsonl", [first, second]))])
    assert summary.trajectories == 1
    partial = list(store.trajectories())[0]
    summary = ingest_files(store, [str(_write(tmp_path / "2.jsonl", [third, first]))])  # late spans, and a retry
    assert (summary.stored, summary.duplicate) == (len(third.resource_spans[0].scope_spans[0].spans), len(first.resource_spans[0].scope_spans[0].spans))
    [t] = list(store.trajectories())
    assert len(t.steps) > len(partial.steps)
    reference = Store(tmp_path / "ref.duckdb")
    ingest_files(reference, [str(_write(tmp_path / "whole.jsonl", [whole]))])
    assert t.export() == list(reference.trajectories())[0].export()
    assert store.connection.execute("SELECT count(*) FROM spans").fetchall()[0][0] == 5


def test_calls_without_ids_are_matched_by_name_and_arguments_in_the_same_turn(store: Store, tmp_path: Path) -> None:
    def build(tracer) -> None:
        with tracer.start_as_current_span("run"):
            with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "tool_call", "name": "lookup", "arguments": {"q": "a"}},
                                                     {"type": "tool_call", "name": "lookup", "arguments": {"q": "b"}}]}])}):
                pass
            for q in ("b", "a"):
                with tracer.start_as_current_span("execute_tool lookup", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.arguments": json.dumps({"q": q})}):
                    pass

    ingest_files(store, [str(_write(tmp_path / "a.jsonl", [record(build)]))])
    [t] = list(store.trajectories())
    # Each span is matched to its call; the calls of one response are in the order it proposed them, whichever ran first.
    assert [(s.args, s.source) for s in t.tool_steps] == [({"q": "a"}, "tool_span+llm_output"), ({"q": "b"}, "tool_span+llm_output")]


def test_task_key_falls_back_to_a_hash_of_the_input_and_can_be_reconfigured(store: Store, tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", [record(lambda t: genai_run(t, task=None), resource={"invoice.id": "INV-1029"})])
    ingest_files(store, [str(path)])
    [t] = list(store.trajectories())
    assert t.task_key_source == "input_hash" and str(t.task_key).startswith("input:")
    store.set_task_keys(["invoice.id"])
    store.assemble()
    [t] = list(store.trajectories())
    assert (t.task_key, t.task_key_source) == ("INV-1029", "attribute:invoice.id")


def test_a_version_1_store_migrates_and_rebuilds_its_task_keys(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        ingest_files(store, [str(_write(tmp_path / "a.jsonl", [record(genai_run)]))])
    with duckdb.connect(str(path)) as con:  # the file as version 1 wrote it: no shapes, conversation ids as task keys
        for column in ("shapes", "cache_read_tokens", "cache_write_tokens", "finish_reasons", "handoff_to", "evidence", "decisions",
                       *SPAN_COLUMNS_V8, *SPAN_COLUMNS_V9):
            con.execute(f"ALTER TABLE spans DROP COLUMN {column}")
        con.execute("DROP TABLE logs")
        con.execute("DROP TABLE trace_links")
        con.execute("DROP TABLE violations")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        con.execute("UPDATE trajectories SET task_key = 'INV-1029', task_key_source = 'attribute:gen_ai.conversation.id'")
    with Store(path, read_only=True) as store:  # a reader does not migrate, and coverage still answers
        assert store.schema_version == 1 and coverage_report(store)["overall"]["shapes"] == {"unwrapped": {}, "kept_as_is": {}}
    with Store(path) as store:
        store.assemble()
        [t] = list(store.trajectories())
        assert t.task_key_source == "input_hash" and t.context["gen_ai.conversation.id"] == "INV-1029"
        assert store.connection.execute("SELECT count(*) FROM spans WHERE shapes IS NULL").fetchall()[0][0] > 0
        ingest_files(store, [str(_write(tmp_path / "b.jsonl", [record(genai_run)]))])  # new rows write the new column
        assert store.stored_violations("any spec", [t.trajectory_id]) == set()  # the violations table exists now


def test_a_version_4_store_keeps_the_violations_its_check_wrote(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:  # version 4: `plumbline check` created the table itself, with the same columns
        for column in (*SPAN_COLUMNS_V8, *SPAN_COLUMNS_V9):
            con.execute(f"ALTER TABLE spans DROP COLUMN {column}")
        con.execute("DROP TABLE trace_links")
        con.execute("DROP TABLE violations")
        con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
        con.execute("CREATE TABLE violations (spec_hash VARCHAR NOT NULL, invariant_id VARCHAR NOT NULL, trajectory_id VARCHAR NOT NULL, "
                    "severity VARCHAR NOT NULL, task_key VARCHAR, step_index INTEGER, step_name VARCHAR, detail VARCHAR, "
                    "PRIMARY KEY (spec_hash, trajectory_id, invariant_id))")
        con.execute("INSERT INTO violations VALUES ('h', 'AMOUNT', 'run-1', 'critical', 'T', 2, 'pay', 'off by 10x')")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.stored_violations("h", ["run-1"]) == {("run-1", "AMOUNT")}
        assert store.write_violations("h", ["run-1"], []) == 0 and store.stored_violations("h", ["run-1"]) == set()


def test_a_newer_schema_is_refused_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    with pytest.raises(StoreError, match="upgrade plumbline"):
        Store(path)


def test_cli_ingest_exit_codes_and_summary(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.jsonl", [record(genai_run)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + "{oops\n")
    runner = CliRunner()
    db = str(tmp_path / "cli.duckdb")
    result = runner.invoke(cli, ["ingest", str(good), "--db", db, "--quiet"])
    assert result.exit_code == 0 and "stored 5, duplicate 0, rejected 0" in result.output
    result = runner.invoke(cli, ["ingest", str(bad), "--db", db, "--quiet"])
    assert result.exit_code == 3 and "duplicate 5" in result.output and f"{bad}:2: invalid JSON" in result.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert runner.invoke(cli, ["ingest", str(empty), "--db", db, "--quiet"]).exit_code == 2
    result = runner.invoke(cli, ["trajectories", "--db", db])
    [line] = result.output.strip().splitlines()
    doc = json.loads(line)
    assert {"trajectory_id", "trace_id", "task_key", "service", "input", "final_output", "conventions", "steps"} <= set(doc)
    assert set(doc["steps"][0]) == {"kind", "name", "args", "result", "error", "call_id", "source"}


def test_a_span_outside_every_run_joins_the_run_that_had_started_when_it_did() -> None:
    from plumbline_otel.model import SpanRecord

    trace = "ab" * 16

    def agent(n: int, start: int) -> SpanRecord:
        return SpanRecord(trace, f"{n:016x}", "ffffffffffffffff", "invoke_agent ap", start, start + 50, step_kind="agent",
                          convention="genai", input_text=f"run {n}")

    def orphan_tool(n: int, start: int, name: str) -> SpanRecord:  # its parent was never exported
        return SpanRecord(trace, f"{n:016x}", "eeeeeeeeeeeeeeee", f"execute_tool {name}", start, start + 1,
                          step_kind="tool_call", tool_name=name, convention="genai")

    records = [agent(1, 100), agent(2, 200), agent(3, 300),
               orphan_tool(10, 150, "early"), orphan_tool(11, 200, "at_second_start"), orphan_tool(12, 999, "late"),
               orphan_tool(13, 50, "before_all")]
    runs = assemble_runs(records)
    assert [(t.input, [s.name for s in t.tool_steps]) for t in runs] == [
        ("run 1", ["early"]), ("run 2", ["at_second_start"]), ("run 3", ["late"])]  # before every run: in none


def test_committed_spans_waiting_for_the_checkpoint_survive_a_crash(tmp_path: Path) -> None:
    """A writer checkpoints only at a large log (for speed): what it committed before a crash is still read."""
    db = tmp_path / "live.duckdb"
    writer = Store(db)
    ingest_files(writer, [str(_write(tmp_path / "a.jsonl", [record(genai_run)]))], workers=0)
    stored = writer.connection.execute("SELECT count(*) FROM spans").fetchone()
    # The files as a crash leaves them: the writer never checkpointed or closed.
    crashed = tmp_path / "crashed.duckdb"
    crashed.write_bytes(db.read_bytes())
    Path(f"{crashed}.wal").write_bytes(Path(f"{db}.wal").read_bytes())
    with Store(crashed, read_only=True) as reader:
        assert reader.connection.execute("SELECT count(*) FROM spans").fetchone() == stored
        assert [t.input for t in reader.trajectories()] == ["Pay invoice INV-1029"]
    assert writer.connection.execute("SELECT current_setting('memory_limit')").fetchone() == ("256.0 MiB",)
    writer.close()


def test_a_writer_fills_row_groups_of_its_own_size_and_spills_beside_its_file(tmp_path: Path) -> None:
    """Checkpoints recompress only the row group being filled: a writer's are `ROW_GROUP_SIZE` rows, not DuckDB's 122,880."""
    from plumbline_otel.store import ROW_GROUP_SIZE

    db = tmp_path / "rg.duckdb"
    with Store(db) as store:
        store.connection.execute("CREATE TABLE numbers AS SELECT range AS n FROM range(50000)")
        store.connection.execute("CHECKPOINT")
        groups = store.connection.execute("SELECT DISTINCT row_group_id, count FROM pragma_storage_info('numbers')").fetchall()
        assert len(groups) == -(-50000 // ROW_GROUP_SIZE) and max(n for _, n in groups) == ROW_GROUP_SIZE
        assert store.connection.execute("SELECT current_setting('temp_directory')").fetchone() == (f"{db}.tmp",)
        cursor = store.connection.cursor()  # a cursor (the console's, the API's) opens on the store too
        assert cursor.execute("SELECT count(*) FROM numbers").fetchone() == (50000,)
    with Store(db, read_only=True) as reader:  # the last writer closed: the file is free and checkpointed
        assert reader.connection.execute("SELECT count(*) FROM numbers").fetchone() == (50000,)


def test_writers_of_one_file_in_one_process_share_it_and_the_last_to_close_lets_it_go(tmp_path: Path) -> None:
    db = tmp_path / "shared.duckdb"
    first = Store(db)
    second = Store(str(db))  # as `duckdb.connect` gave two connections of one database, not a lock error
    first.connection.execute("CREATE TABLE seen (x INTEGER)")
    first.close()
    first.close()  # a second close does nothing (it must not close the other store's file)
    second.connection.execute("INSERT INTO seen VALUES (1)")
    assert second.connection.execute("SELECT count(*) FROM seen").fetchone() == (1,)
    second.close()
    with Store(db, read_only=True) as reader:
        assert reader.connection.execute("SELECT count(*) FROM seen").fetchone() == (1,)


def test_in_memory_stores_are_each_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = Store(":memory:"), Store(":memory:")
    first.connection.execute("CREATE TABLE only_in_first (x INTEGER)")
    assert second.connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'only_in_first'").fetchone() == (0,)
    first.close()
    second.close()
    assert not list(tmp_path.iterdir())  # nothing written beside the working directory


@pytest.mark.parametrize("task_keys", [("session.id",), ("gen_ai.conversation.id", "service.name")])
def test_a_record_trimmed_for_assembly_builds_the_same_runs_as_the_whole_record(task_keys: tuple[str, ...]) -> None:
    """Shards hold trimmed records: dropping the attributes assembly does not read changes no trajectory."""
    request = record(genai_run)
    records, _ = normalise_request(request)
    views, _ = normalise_request(request)
    resources: dict[int, dict[str, Any]] = {}
    for view in views:
        trim_for_assembly(view, assembly_keys(task_keys), resources)
    assert all(len(v.attributes) < len(r.attributes) for v, r in zip(views, records))  # the raw maps are gone
    assert len({id(v.resource) for v in views}) == 1  # the spans of one resource share its trimmed map
    assert assemble_runs(views, task_keys) == assemble_runs(records, task_keys)
    [run] = assemble_runs(views, task_keys)
    assert run.context["gen_ai.conversation.id"] == "INV-1029"  # context keys stay
    if "service.name" in task_keys:
        assert run.task_key_source == "attribute:gen_ai.conversation.id"


def test_parallel_calls_run_concurrently_are_in_the_order_the_model_proposed_them() -> None:
    """CrewAI runs one response's calls in a thread pool and its tool spans carry no call id: the call proposed second
    may start first. The response's order is the run's; the steps around the calls keep their places."""
    def build(tracer: Any) -> None:
        calls = [{"type": "tool_call", "id": "c1", "name": "lookup_invoice", "arguments": {"invoice_id": "INV-1"}},
                 {"type": "tool_call", "id": "c2", "name": "check_duplicate", "arguments": {"invoice_id": "INV-1", "vendor": "Acme"}}]
        with tracer.start_as_current_span("invoke_agent ap", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m1", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Pay INV-1"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": calls}])}):
                pass
            for call in reversed(calls):  # the second call starts first
                with tracer.start_as_current_span(f"execute_tool {call['name']}", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["name"],
                        "gen_ai.tool.call.arguments": json.dumps(call["arguments"])}):
                    pass
            with tracer.start_as_current_span("chat m1", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "done"}]}])}):
                pass

    records, problems = normalise_request(record(build))
    (run,) = assemble_runs(records)
    assert problems == [] and [(s.kind, s.name, s.call_id) for s in run.steps] == [
        ("llm_call", "chat m1", None), ("tool_call", "lookup_invoice", "c1"), ("tool_call", "check_duplicate", "c2"), ("llm_call", "chat m1", None)]
