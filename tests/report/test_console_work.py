"""Issue 31: a console a user can work in. `check --server` and `certify --server` keep their results in the
served store and the console says exactly what to run; the runs list (status, request, agent, task, perturbation,
study, duration, tokens, cost; filters; sort; never the driver's records); the run page (waterfall, messages,
violations where they broke, a diff link)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from pages_support import NO_RETRY, SPEC, TOKEN, WITH_RETRY, Built, build_store, free_port, parse, serve, text_of

from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import SpanSink, StudyConfig, run_study
from plumbline_otel.report import data
from plumbline_otel.report.console import Console
from plumbline_otel.store import Reader, RunFilters, Store

_NS = {"h": "http://www.w3.org/1999/xhtml"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("work"))


def _rows(html: str) -> list[dict[str, str]]:
    doc = parse(html)
    out = []
    for tr in doc.findall(".//h:table[@class='runs']/h:tbody/h:tr", _NS):
        cells = tr.findall("h:td", _NS)
        out.append({"status": tr.get("data-status") or "", "text": text_of(tr), "request": text_of(cells[1]),
                    "href": cells[1].find("h:a", _NS).get("href"), "agent": text_of(cells[2]), "perturbation": text_of(cells[4])})
    return out


def _main_text(html: str) -> str:
    return " ".join(text_of(parse(html).find(".//h:main", _NS)).split())


def test_check_and_certify_through_the_server_fill_the_console(built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "held.duckdb"
    with Store(db) as store:  # the same traffic, never checked
        ingest_files(store, [str(ROOT / "tests" / "report" / "retry_fault")])
    port = free_port()
    s = serve(db, grpc_port=port)
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", TOKEN)
    try:
        overview = parse(s.get("/").text)
        command = text_of(overview.find(".//*[@data-testid='check-command']", _NS))
        assert command == f"plumbline check --spec SPEC.yaml --server 127.0.0.1:{port}", "the page names this server, not a file it holds"
        assert "PLUMBLINE_AUTH_TOKEN" in text_of(overview.find(".//*[@data-testid='check-advice']", _NS))
        assert {r["status"] for r in _rows(s.get("/runs").text)} == {"not_checked"}

        args = shlex.split(command.replace("SPEC.yaml", str(SPEC)))[1:]  # exactly what the page said, with a real spec
        checked = CliRunner().invoke(cli, args)
        assert checked.exit_code == 0, checked.output
        assert "kept by the server" in checked.output

        page = s.get("/").text
        assert parse(page).findall(".//h:tr[@class='violation']", _NS), "the violations are in the served store now"
        assert "2 run(s)" in text_of(parse(page).find(".//*[@data-testid='checks']", _NS))
        rows = _rows(s.get("/runs").text)
        by_agent = {r["agent"].split("@")[0]: r for r in rows}
        assert by_agent[NO_RETRY]["status"] == "violating" and "AP-PAY-CLEAN" in by_agent[NO_RETRY]["text"]
        assert by_agent[WITH_RETRY]["status"] == "conforming"
        run = _main_text(s.get(by_agent[NO_RETRY]["href"]).text)
        assert "broke here" in run and "AP-NO-FLAG-CLEAN" in run, "the run page shows its violations at the step"

        # the advice now names the spec that was used; certify --server keeps the certificate the overview shows
        assert str(SPEC) in text_of(parse(s.get("/").text).find(".//*[@data-testid='certify-command']", _NS))
        certified = CliRunner().invoke(cli, ["certify", "--spec", str(SPEC), "--server", f"127.0.0.1:{port}", "--out",
                                             str(tmp_path / "cert.json"), "--format", "none"])
        assert certified.exit_code == 0, certified.output
        cert = json.loads((tmp_path / "cert.json").read_text())
        headline = text_of(parse(s.get("/").text).find(".//*[@data-testid='headline']", _NS))
        assert headline == f"{cert['headline']['verdict']} at least {100 * cert['headline']['lower_bound']:.1f}%"
    finally:
        s.server.stop()


def test_check_on_a_file_keeps_which_runs_were_judged_and_the_report_says_what_to_run(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "file.duckdb"
    with Store(db) as store:
        ingest_files(store, [str(ROOT / "tests" / "report" / "retry_fault")])
    report = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--out", str(report)]).exit_code == 0
    advice = text_of(parse(report.read_text()).find(".//*[@data-testid='check-advice']", _NS))
    assert f"plumbline check --spec SPEC.yaml --db {db}" in advice and "write the report again" in advice
    assert CliRunner().invoke(cli, ["check", "--spec", str(SPEC), "--db", str(db)]).exit_code == 0
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM checked_runs").fetchall() == [(2,)]
        statuses = sorted(r["status"] for r in data.runs_page(Reader(connection)).rows)
    assert statuses == ["conforming", "violating"]


def test_the_runs_list_filters_sorts_and_shows_what_each_run_was(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "list.duckdb"
    shutil.copy(built.db, db)
    root = duckdb.connect(str(db))
    console = Console(root.cursor(), str(db), api="127.0.0.1:4317")
    try:
        def rows(query: str = "") -> list[dict[str, str]]:
            status, html = console.handle("/runs", query)
            assert status == 200, html
            return _rows(html)

        everything = rows()
        assert len(everything) == 4
        fault = next(r for r in everything if r["agent"] == f"{NO_RETRY}@1.0.0")
        assert fault["request"] == "Please process invoice INV-1001 from Northwind Supplies."
        assert "tool_fault" in fault["perturbation"] and "ap-plan_execute-seed0" in fault["text"]
        assert "ms" in fault["text"] and "in /" in fault["text"], "duration and tokens where the trace has them"
        assert {r["agent"] for r in rows("perturbation=tool_fault")} == {f"{NO_RETRY}@1.0.0", f"{WITH_RETRY}@1.0.0"}
        assert len(rows("q=northwind")) == 2 and rows("q=nothing-like-it") == []
        assert len(rows("study=ap-plan_execute-seed0")) == 1
        assert [r["agent"] for r in rows(f"agent={WITH_RETRY}")] == [f"{WITH_RETRY}@1.0.0"]
        assert {r["status"] for r in rows("status=violating")} == {"violating"}
        assert len(rows("invariant=AP-NO-FLAG-CLEAN")) == 1
        assert len(rows("task=INV-1001")) == 2
        durations = [r["request"] for r in rows("sort=duration&order=asc")]
        assert durations[-2:] != durations[:2] and len(durations) == 4
        status, page = console.handle("/runs", "sort=tokens")
        assert status == 200
        # the filter form and sort links keep the other filters
        doc = parse(console.handle("/runs", "perturbation=tool_fault")[1])
        sorts = [a.get("href") for a in doc.findall(".//h:thead//h:a", _NS)]
        assert sorts and all("perturbation=tool_fault" in h for h in sorts)
    finally:
        console.close()
        root.close()


def test_the_run_page_has_a_waterfall_with_messages_and_a_diff_link(built: Built, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    shutil.copy(built.db, db)
    root = duckdb.connect(str(db))
    console = Console(root.cursor(), str(db))
    try:
        row = next(r for r in _rows(console.handle("/runs", f"agent={NO_RETRY}")[1]))
        status, html = console.handle(row["href"].split("?")[0], "")
        assert status == 200
        doc = parse(html)
        spans = doc.findall(".//h:table[@class='waterfall']/h:tbody/h:tr", _NS)
        assert len(spans) == 12
        bars = [tr.find(".//h:div[@class='wf-bar']", _NS).get("style") for tr in spans]
        assert all(b.startswith("left:") and "width:" in b for b in bars)
        llm = [tr for tr in spans if "kind-llm_call" in tr.get("class")]
        assert llm and "Northwind" in text_of(llm[0].find(".//*[@data-testid='messages-in']", _NS))
        violated = [tr for tr in spans if "violated" in tr.get("class")]
        assert violated and "broke here" in text_of(violated[0]) and "flag_exception" in text_of(violated[0])
        link = doc.find(".//h:a[@data-testid='diff-link']", _NS).get("href")
        assert link.startswith("/diff?")
        path, _, query = link.partition("?")
        diff_status, diff = console.handle(path, query)
        assert diff_status == 200 and "first divergence" in text_of(parse(diff))
        assert "violating" in text_of(doc.find(".//*[@data-testid='run-status']", _NS))
    finally:
        console.close()
        root.close()


def test_the_runs_list_takes_a_trial_s_status_from_the_driver_s_records_and_never_lists_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # the adapter imports tests.replay.toy
    from replay.toy import CrashAfterExport, ToyAgent, tasks

    sink = SpanSink(otlp_file=str(tmp_path / "traffic.jsonl"))
    run_study(StudyConfig("traffic", sink=sink), tasks(2), ToyAgent())
    sink.close()
    db = tmp_path / "study.duckdb"
    with Store(db) as store:
        ingest_files(store, [str(tmp_path / "traffic.jsonl")])
    spans = tmp_path / "s.otlp.jsonl"
    replayed = CliRunner().invoke(cli, ["replay", "--db", str(db), "--study", "s", "--agent", "toy-agent", "--adapter",
                                        f"python:tests.replay.toy:{CrashAfterExport.__name__}", "--perturbations", "baseline",
                                        "--repeats", "1", "--otlp-file", str(spans), "--trace-wait", "2", "--quiet"])
    assert replayed.exception is None or isinstance(replayed.exception, SystemExit), replayed.output
    assert CliRunner().invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code in (0, 3)
    with duckdb.connect(str(db), read_only=True) as connection:
        ((records,),) = connection.execute("SELECT count(*) FROM trajectories WHERE n_steps = 0").fetchall()
        assert records >= 4, "plan and attempt records are stored as trajectories"
        page = data.runs_page(Reader(connection), filters=RunFilters(study="s"))
        assert page.total == 2 and len(page.rows) == 2, "two trials' runs; none of the records"
        assert {r["status"] for r in page.rows} == {"errored"}
        assert all("crashed after exporting" in (r["reason"] or "") for r in page.rows)
        assert data.runs_page(Reader(connection), filters=RunFilters(status="errored")).total == 2
        assert data.runs_page(Reader(connection)).total == 4  # the traffic's two runs and the study's two
