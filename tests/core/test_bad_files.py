"""Damaged trace files lose only what is damaged: a runaway value, a cut gzip stream, impossible timestamps."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.store import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "producers"


def _deep(levels: int) -> dict:
    value: dict = {"stringValue": "bottom"}
    for _ in range(levels):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    return value


def _span(span_id: str, attributes: list[dict], start: int = 1_000, end: int = 2_000) -> dict:
    return {"traceId": "ab" * 16, "spanId": span_id * 8, "name": f"span {span_id}", "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end), "attributes": attributes}


def _ingest(tmp_path: Path, path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["ingest", str(path), "--db", str(tmp_path / "s.duckdb"), "--quiet"])
    return result.exit_code, result.output


def test_a_value_nested_past_the_json_parsers_limit_costs_that_value_only(tmp_path: Path) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))  # only to write the file: the json module recurses
    try:
        line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
            _span("01", [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                         {"key": "runaway", "value": _deep(400)}, {"key": "kept", "value": {"stringValue": 'a "[{" in text'}}]),
            _span("02", [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}])]}]}]})
    finally:
        sys.setrecursionlimit(limit)
    path = tmp_path / "deep.otlp.jsonl"
    path.write_text(line + "\n")
    code, output = _ingest(tmp_path, path)
    assert code == 3
    assert "attribute 'runaway'" in output and "nested too deeply to read" in output
    with Store(tmp_path / "s.duckdb") as store:
        rows = store.connection.execute(
            "SELECT span_id, dropped_attributes_count, json_extract_string(attributes, '$.kept') FROM spans ORDER BY 1").fetchall()
    assert rows == [("01" * 8, 1, 'a "[{" in text'), ("02" * 8, 0, None)]


def test_a_truncated_gzip_file_keeps_what_decompressed_and_says_so(tmp_path: Path) -> None:
    whole = (FIXTURES / "openinference_openai.otlp.jsonl").read_bytes()
    packed = gzip.compress(whole)
    path = tmp_path / "cut.otlp.jsonl.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    code, output = _ingest(tmp_path, path)
    assert code == 3
    assert "the gzip stream is truncated" in output and "Aborted" not in output
    with Store(tmp_path / "s.duckdb") as store:
        kept = store.connection.execute("SELECT count(*) FROM spans").fetchone()
    assert kept is not None and kept[0] > 0


def test_spans_with_impossible_timestamps_are_kept_reported_and_ordered(tmp_path: Path) -> None:
    def tool(span_id: str, name: str, start: int, end: int) -> dict:
        return _span(span_id, [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                               {"key": "gen_ai.tool.name", "value": {"stringValue": name}},
                               {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": "{}"}}], start, end)

    spans = [tool("01", "first", 1_000, 2_000), tool("02", "second", 0, 3_000), tool("03", "third", 4_000, 3_500),
             tool("04", "fourth", 5_000, 0)]
    path = tmp_path / "times.otlp.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    code, output = _ingest(tmp_path, path)
    assert code == 3
    assert "has no start time" in output and "before it starts" in output and "has no end time" in output
    with Store(tmp_path / "s.duckdb") as store:
        (run,) = list(store.trajectories())
        rows = store.connection.execute("SELECT count(*), min(end_ns - start_ns) FROM spans").fetchone()
    assert [s.name for s in run.tool_steps] == ["first", "second", "third", "fourth"]
    assert rows == (4, 0)
