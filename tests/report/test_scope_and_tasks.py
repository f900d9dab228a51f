"""Issue 31 items 4 and 5: tasks shown by their request text, and the smaller walls (task keys: tests/core/test_task_keys.py).

A task is read by its request (and key when one was set), in the pages and on the terminal; one study's
report holds only that study's runs in every section; the header counts spans through `--server`; the
recorded sample services are no agents; no "outcome agrees 0/0"; `plumbline show` fits a terminal; a
page number past the end is the last page, not a 500."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import click
import duckdb
import pytest
from click.testing import CliRunner
from pages_support import NO_RETRY, TOKEN, TOY_SPEC, Built, build_store, free_port, parse, serve, text_of, two_studies

from plumbline_otel.cli.main import cli
from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report.console import Console
from plumbline_otel.report.html import render, task_label
from plumbline_otel.report.render import TEXT_WIDTH
from plumbline_otel.report.terminal import run_text
from plumbline_otel.store import FIXTURE_PREFIX, Reader, Store

_NS = {"h": "http://www.w3.org/1999/xhtml"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("scope"))


def _main(html: str) -> str:
    return " ".join(text_of(parse(html).find(".//h:main", _NS)).split())


def test_one_study_s_report_holds_only_that_study_s_runs(tmp_path: Path) -> None:
    db = two_studies(tmp_path / "two.duckdb")
    spec = tmp_path / "toy.yaml"
    spec.write_text(TOY_SPEC)
    out = tmp_path / "clean.html"
    result = CliRunner().invoke(cli, ["report", "--db", str(db), "--spec", str(spec), "--study", "clean", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = parse(out.read_text())
    totals = " ".join(text_of(doc.find(".//*[@data-testid='totals']", _NS)).split())
    assert "study clean only" in totals and "12 runs of 2 agent(s) on 3 task(s)" in totals
    assert doc.findall(".//h:tr[@class='violation']", _NS) == [], "the other study's violations are not this report's"
    assert "no-violations" in out.read_text()
    assert "of study clean" in text_of(doc.find(".//h:section[@id='consistency']", _NS))
    for section in ("diffs", "runs"):
        assert "broken-" not in "".join(text_of(s) for s in doc.findall(f".//h:section[@id='{section}']", _NS))
    assert all("broken-" not in (s.get("id") or "") for s in doc.findall(".//h:section", _NS))
    # the whole store's report still shows the broken study's violations
    whole = tmp_path / "whole.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--spec", str(spec), "--out", str(whole)]).exit_code == 0
    assert parse(whole.read_text()).findall(".//h:tr[@class='violation']", _NS)

    # a certificate of one study makes the report of that study without --study; another study is refused
    cert = tmp_path / "broken.json"
    certified = CliRunner().invoke(cli, ["certify", "--db", str(db), "--spec", str(spec), "--study", "broken", "--out", str(cert),
                                         "--format", "none"])
    assert certified.exit_code in (0, 1), certified.output
    by_cert = tmp_path / "by-cert.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--cert", str(cert), "--out", str(by_cert)]).exit_code == 0
    page = parse(by_cert.read_text())
    assert "study broken only" in text_of(page.find(".//*[@data-testid='totals']", _NS))
    assert "4 runs of 1 agent(s)" in " ".join(text_of(page.find(".//*[@data-testid='totals']", _NS)).split())
    refused = CliRunner().invoke(cli, ["report", "--db", str(db), "--cert", str(cert), "--study", "clean", "--out", str(by_cert)])
    assert refused.exit_code != 0 and "study 'broken', not 'clean'" in str(refused.exception)


def test_the_report_through_a_server_counts_the_server_s_spans(built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "served.duckdb"
    shutil.copy(built.db, db)
    with duckdb.connect(str(db), read_only=True) as connection:
        ((spans,),) = connection.execute("SELECT count(*) FROM spans").fetchall()
    assert spans > 0
    port = free_port()
    s = serve(db, grpc_port=port)
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", TOKEN)
    try:
        out = tmp_path / "served.html"
        result = CliRunner().invoke(cli, ["report", "--server", f"127.0.0.1:{port}", "--out", str(out)])
        assert result.exit_code == 0, result.output
        totals = " ".join(text_of(parse(out.read_text()).find(".//*[@data-testid='totals']", _NS)).split())
        assert f"{spans} spans" in totals and not totals.startswith("0 spans")
    finally:
        s.server.stop()


def test_recorded_sample_services_are_not_agents(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "samples.duckdb"
    shutil.copy(built.db, db)
    sample = Trajectory("sample-1", "sample-1", None, "none", FIXTURE_PREFIX + "openinference-openai", None, None, "hello", None,
                        ("openinference",), (), 1, 2)
    with Store(db) as store:
        store.add_trajectories([sample])
    with duckdb.connect(str(db), read_only=True) as connection:
        totals = Reader(connection).totals()
        ((agents,),) = connection.execute("SELECT count(DISTINCT service) FROM trajectories WHERE n_steps > 0").fetchall()
    assert totals["agents"] == agents and totals["samples"] == 1 and totals["sample_services"] == 1
    out = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--out", str(out)]).exit_code == 0
    line = " ".join(text_of(parse(out.read_text()).find(".//*[@data-testid='totals']", _NS)).split())
    assert f"of {agents} agent(s)" in line and "1 run(s) of 1 recorded sample service(s), not counted as agents" in line


def test_no_outcome_column_where_no_outcome_is_known() -> None:
    zero = {"spans": {"spans": 0, "traces": 0}, "tool_calls": {"tool_calls": 0, "with_structured_args": 0, "with_results": 0},
            "llm_calls": {"llm_calls": 0}, "trajectories": {"trajectories": 0, "tasks": 0}, "findings": []}
    empty = {"overall": zero, "services": {}}

    def table(outcome: dict[str, int]) -> str:
        e = {"a": "A", "b": "B", "runs": 3, "same_effect_path": 2, "same_arguments": 1, "outcome": outcome, "divergences": []}
        page = render("report.html", lambda kind, **p: "#", cert=None, chart=[], source="s", generated="now", violations=[],
                      totals={"spans": 1, "runs": 3, "agents": 2, "tasks": 1}, study=None, coverage=empty, coverage_note=None,
                      consistency={"runs": 0}, equivalences=[e], window="w", diffs=[], runs=[], how=None)
        return " ".join(text_of(parse(page).find(".//h:table[@data-testid='equivalence']", _NS)).split())

    assert "outcome agrees" not in table({"agree": 0, "known": 0}) and "0/0" not in table({"agree": 0, "known": 0})
    assert "outcome agrees" in table({"agree": 2, "known": 3}) and "2/3" in table({"agree": 2, "known": 3})


def test_a_task_is_shown_by_its_request_text() -> None:
    assert task_label("input:18174c956134162c", "input_hash", "Please  pay\ninvoice 7") == "“Please pay invoice 7”"
    assert task_label("INV-7", "attribute:plumbline.task.key", "Please pay invoice 7") == "“Please pay invoice 7” (INV-7)"
    assert task_label("INV-7", "attribute:plumbline.task.key", None) == "INV-7"
    assert task_label(None, "none", None) == "(no task)"
    assert task_label("input:ab", "input_hash", "x" * 200, 20) == "“" + "x" * 19 + "…”"


def test_hashed_tasks_read_as_their_request_in_the_console(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "hashed.duckdb"
    shutil.copy(built.db, db)
    hashed = [Trajectory(f"h-{agent}", f"h-{agent}", "input:18174c956134162c", "input_hash", agent, "1", None,
                         "Book a table for two at eight", None, ("gen_ai",), (Step("tool_call", "book", {"n": 2}),), 5, 6)
              for agent in ("hash-a", "hash-b")]
    with Store(db) as store:
        store.add_trajectories(hashed)
    root = duckdb.connect(str(db))
    console = Console(root.cursor(), str(db))
    try:
        runs = parse(console.handle("/runs", "agent=hash-a")[1])
        assert text_of(runs.find(".//*[@data-testid='task-by-request']", _NS)) == "same request"
        assert "input:18174c956134162c" not in " ".join(text_of(td) for td in runs.findall(".//h:tbody//h:td", _NS))
        run = parse(console.handle("/runs/h-hash-a", "")[1])
        assert text_of(run.find(".//*[@data-testid='run-task']", _NS)) == "“Book a table for two at eight”"
        diff = parse(console.handle("/diff", "a=h-hash-a&b=h-hash-b")[1])
        assert text_of(diff.find(".//*[@data-testid='diff-task']", _NS)) == "“Book a table for two at eight”"
        _, overview = console.handle("/", "")
        for _ in range(50):  # the diffable tasks are computed in the background
            if "Being computed" not in overview.split('id="diffs"')[1]:
                break
            _, overview = console.handle("/", "")
        assert "“Book a table for two at eight”" in _main(overview) and "input:18174c956134162c" not in _main(overview)
        keyed = parse(console.handle("/runs", f"agent={NO_RETRY}")[1])
        assert text_of(keyed.findall(".//h:tbody/h:tr/h:td", _NS)[3]).strip(), "a task key that was set is shown as it is"
    finally:
        console.close()
        root.close()


def test_violation_examples_name_the_task_by_its_request(built: Built) -> None:
    page = parse(built.report.read_text())
    examples = " ".join(text_of(e) for e in page.findall(".//h:div[@class='example']", _NS))
    assert "“Please process invoice INV-1001 from Northwind Supplies.”" in examples


def test_a_page_past_the_last_is_the_last_page(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "pages.duckdb"
    shutil.copy(built.db, db)
    root = duckdb.connect(str(db))
    console = Console(root.cursor(), str(db))
    try:
        for number in ("99999999999999999999999", "4611686018427387904", "12"):
            status, html = console.handle("/runs", f"page={number}")
            assert status == 200, html
            assert "page 1 of 1" in text_of(parse(html).find(".//*[@data-testid='runs-count']", _NS))
            assert len(parse(html).findall(".//h:table[@class='runs']/h:tbody/h:tr", _NS)) == 4
        assert console.handle("/runs", "page=-3")[0] == 200
        assert console.handle("/runs", "page=lots")[0] == 400
    finally:
        console.close()
        root.close()


def test_show_fits_a_terminal(tmp_path: Path) -> None:
    long = {"note": "y" * 500, "lines": [{"sku": f"SKU-{i}", "amount": i * 1.5} for i in range(40)]}
    run = Trajectory("r-long", "r-long", "INV-9", "attribute:plumbline.task.key", "agent-" + "z" * 120, "9.9", None,
                     "Please pay invoice INV-9 " + "and more " * 40, "done " * 100, ("gen_ai",),
                     (Step("tool_call", "pay", long, result={"ok": "w" * 400}, error="E" * 300),), 1, 2)
    violations: list[dict[str, Any]] = [{"invariant_id": "PAY-" + "Q" * 50, "severity": "critical", "step_index": 0, "detail": "d " * 200},
                  {"invariant_id": "OTHER", "severity": "major", "step_index": None, "detail": "e " * 200}]
    text = click.unstyle(run_text(run, violations))  # colour codes take no columns
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= TEXT_WIDTH, max(lines, key=len)
    assert "w" * 300 in text.replace("\n", "").replace(" ", ""), "long values wrap, not vanish"
    assert any(line.startswith("  task “Please pay invoice INV-9") and line.rstrip().endswith("(INV-9)") for line in lines)

    db = tmp_path / "show.duckdb"
    with Store(db) as store:
        store.add_trajectories([run])
    shown = CliRunner().invoke(cli, ["show", "r-long", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= TEXT_WIDTH


def test_show_diff_fits_a_terminal(built: Built) -> None:
    shown = CliRunner().invoke(cli, ["show", "--db", str(built.db), "--task", "INV-1001", "--vs", NO_RETRY])
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= TEXT_WIDTH
    assert "task “Please process invoice INV-1001 from Northwind Supplies.” (INV-1001)" in shown.output
    json.dumps(shown.output)  # plain text (no terminal): nothing unprintable
    assert "\x1b" not in shown.output

