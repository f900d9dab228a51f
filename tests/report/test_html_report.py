"""The HTML report: valid, self-contained, escaped, and showing what the user decides from."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pages_support import (
    BREAKOUT,
    HOSTILE_TASK,
    IMG,
    NO_RETRY,
    SCRIPT,
    WITH_RETRY,
    Built,
    assert_self_contained,
    build_store,
    parse,
    text_of,
)

from plumbline_otel.cli.main import cli
from plumbline_otel.errors import InputError
from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report import Certificate, data, load_certificate
from plumbline_otel.report.diff import diff_runs
from plumbline_otel.report.html import chart_rows
from plumbline_otel.report.model import PassK, PassKPoint, RunReason
from plumbline_otel.store import Store

_NS = {"h": "http://www.w3.org/1999/xhtml"}


def _with_cell(cert: Certificate, agent: str, **changes: Any) -> Certificate:
    """`cert` with the first cell of `agent` changed (the model is frozen; a page renders whatever it is given)."""
    agents = tuple(dataclasses.replace(a, perturbations=(dataclasses.replace(a.perturbations[0], **changes), *a.perturbations[1:]))
                   if a.agent == agent else a for a in cert.agents)
    return dataclasses.replace(cert, agents=agents)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("pages"))


def test_report_is_valid_self_contained_html(built: Built) -> None:
    assert_self_contained(built.report.read_text())


def test_report_shows_headline_chart_violations_and_the_retry_diff(built: Built) -> None:
    html = built.report.read_text()
    doc = parse(html)
    cert = load_certificate(built.cert)
    headline = doc.find(".//*[@data-testid='headline']", _NS)
    assert text_of(headline) == f"{cert.headline.verdict} at least {100 * cert.headline.lower_bound:.1f}%"
    assert text_of(doc.find(".//*[@data-testid='headline-sentence']", _NS)).startswith(f"{cert.headline.verdict}: ")
    cells = cert.cells
    bars = [r for r in doc.iter("{http://www.w3.org/2000/svg}rect") if "bar" in (r.get("class") or "")]
    assert len(bars) == 2 * len(cells), "a Wilson bar and a gate bar per cell"
    violations = doc.findall(".//h:tr[@class='violation']", _NS)
    assert violations and "AP-PAY-CLEAN" in "".join(text_of(v) for v in violations)
    diff = next(s for s in doc.findall(".//h:section[@class='diff-view']", _NS) if NO_RETRY in text_of(s))
    first = [tr for tr in diff.iter("{http://www.w3.org/1999/xhtml}tr") if "first-divergence" in (tr.get("class") or "")]
    assert len(first) == 1
    assert "check_duplicate" in text_of(first[0]) and "only in B" in text_of(first[0]), "the retry is where the runs part"
    assert WITH_RETRY in text_of(diff) and "schedule_payment" in text_of(diff)


def test_every_example_link_lands_on_a_run_in_the_file(built: Built) -> None:
    doc = parse(built.report.read_text())
    ids = {el.get("id") for el in doc.iter() if el.get("id")}
    links = [a.get("href") for a in doc.findall(".//h:a", _NS) if (a.get("href") or "").startswith("#run-")]
    assert links and all(href[1:] in ids for href in links)


def test_trace_values_render_as_text_never_as_markup(built: Built) -> None:
    html = built.report.read_text()
    doc = parse(html)
    body = text_of(doc)
    for hostile in (SCRIPT, BREAKOUT, HOSTILE_TASK):
        assert hostile in body, f"{hostile!r} is shown, as text"
    assert IMG.replace('"', '\\"') in body or IMG in body
    assert doc.find(".//*[@id='owned']", _NS) is None and not doc.findall(".//h:img", _NS)
    assert "<script>window" not in html and "<img" not in html


def test_violations_point_at_the_step_that_broke_them(built: Built) -> None:
    with Store(built.db) as store:
        rows = store.connection.execute("SELECT trajectory_id, step_index FROM violations WHERE step_index IS NOT NULL").fetchall()
        from plumbline_otel.report.pages import file_href, run_page

        assert rows, "the retry-fault fixture's no-retry run breaks a step-located invariant"
        run = store.load_run(rows[0][0])
        assert run is not None
        doc = parse(run_page(store, run, file_href({})))
    marked = doc.findall(".//h:tr[@class='step violated']", _NS) + doc.findall(".//h:tr[@class='step failed violated']", _NS)
    assert [int(text_of(tr.find("h:td", _NS))) for tr in marked] == [rows[0][1]]


def _run(name: str, *steps: Step, service: str = "a") -> Trajectory:
    return Trajectory(name, name, "K", "attribute:session.id", service, None, None, None, None, (), steps)


def test_diff_types_argument_differences_and_marks_the_first_divergence() -> None:
    pay = lambda amount: Step("tool_call", "schedule_payment", {"amount": amount, "invoice": "INV-1"})
    a = _run("A", Step("tool_call", "get_invoice", {"id": "INV-1"}), pay("28500.00"))
    b = _run("B", Step("tool_call", "get_invoice", {"id": " inv-1 "}), Step("llm_call", "model"), pay("285000.00"), service="b")
    d = diff_runs(a, b)
    assert [r.column for r in d.rows] == ["same", "same"], "LLM turns are not aligned, tool calls are"
    assert d.rows[0].arg_differences == () and d.first == 1
    assert d.rows[1].first_divergence and d.rows[1].b_index == 2
    assert d.rows[1].arg_differences == ("amount: expected 28500.00, got 285000.00 (10× too large)",)


def test_diff_marks_skipped_extra_and_failed_steps() -> None:
    s = lambda name, error=None: Step("tool_call", name, {}, error=error)
    d = diff_runs(_run("A", s("get"), s("match", "503"), s("flag")),
                  _run("B", s("get"), s("match", "503"), s("match"), s("pay")))
    assert [(r.column, r.label) for r in d.rows] == [("same", "same"), ("same", "same"), ("substituted", "substituted"),
                                                     ("extra", "only in B")]
    assert d.first == 2
    same_name_other_outcome = diff_runs(_run("A", s("get", "503")), _run("B", s("get")))
    assert same_name_other_outcome.first == 0, "a call that failed on one side only is a divergence"


def test_chart_draws_the_interval_the_gate_uses_with_every_count(built: Built) -> None:
    cert = load_certificate(built.cert)
    assert all(r.gate_method == "wilson_tasks" for r in chart_rows(cert))
    cell = cert.cells[0]
    cert = _with_cell(cert, cell.agent, gate_lower=0.25, gate_upper=0.75, gate_method="betting_cs", exposed=3, errored=1, missing=2)
    row = next(r for r in chart_rows(cert) if (r.agent, r.perturbation) == (cell.agent, cell.perturbation))
    assert row.gate == (105.0, 315.0) and row.gate_method == "betting_cs"
    assert "exposed 3" in row.tip and "errored 1" in row.tip and "missing 2" in row.tip


def test_runs_are_listed_a_page_at_a_time(built: Built) -> None:
    with Store(built.db) as store:
        first = data.runs_page(store, page=0, size=2)
        second = data.runs_page(store, page=1, size=2)
        only = data.runs_page(store, agent=NO_RETRY)
    assert first.total == 4 and first.pages == 2 and len(first.rows) == len(second.rows) == 2
    assert {r["trajectory_id"] for r in first.rows}.isdisjoint(r["trajectory_id"] for r in second.rows)
    assert [r["agent"].split("@")[0] for r in only.rows] == [NO_RETRY]


def test_report_and_show_commands(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    runner = CliRunner()
    result = runner.invoke(cli, ["report", "--db", str(built.db), "--cert", str(built.cert), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    assert_self_contained(out.read_text())
    shown = runner.invoke(cli, ["show", "--db", str(built.db), "--task", "INV-1001", "--vs", WITH_RETRY])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    flagged = [line for line in lines if line.startswith(">>")]
    assert len(flagged) == 1 and "check_duplicate" in flagged[0] and "only in B" in flagged[0]
    assert "\x1b[" not in shown.output, "no colour codes when not a terminal"
    with Store(built.db) as store:
        run_id = data.runs_page(store, agent=NO_RETRY).rows[0]["trajectory_id"]
    one = runner.invoke(cli, ["show", "--db", str(built.db), run_id])
    assert one.exit_code == 0 and "check_duplicate" in one.output and "503" in one.output
    missing = runner.invoke(cli, ["show", "--db", str(built.db), "nope"])
    assert isinstance(missing.exception, InputError) and "no stored run 'nope'" in str(missing.exception)


def test_report_with_a_spec_judges_and_certifies_on_the_way(built: Built, tmp_path: Path) -> None:
    import shutil

    from pages_support import SPEC

    db = tmp_path / "fresh.duckdb"
    shutil.copy(built.db, db)
    with Store(db) as store:
        store.connection.execute("DELETE FROM violations")  # a store never checked
    out = tmp_path / "spec.html"
    result = CliRunner().invoke(cli, ["report", "--db", str(db), "--spec", str(SPEC), "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = parse(out.read_text())
    assert doc.find(".//*[@data-testid='headline']", _NS) is not None
    assert "AP-PAY-CLEAN" in text_of(doc.find(".//h:section[@id='violations']", _NS))


def test_show_colours_a_terminal(built: Built) -> None:
    shown = CliRunner().invoke(cli, ["show", "--db", str(built.db), "--task", "INV-1001", "--vs", WITH_RETRY], color=True)
    assert shown.exit_code == 0
    flagged = next(line for line in shown.output.splitlines() if "only in B" in line)
    assert "\x1b[31m" in flagged, "the divergence flag and the failed call are red on a terminal"


def test_cells_table_renders_the_new_certificate_fields_when_present(built: Built) -> None:
    from plumbline_otel.report.pages import report_html

    cert = load_certificate(built.cert)
    cert = dataclasses.replace(cert, headline=dataclasses.replace(cert.headline, method="betting_cs", method_description="a betting sequence",
                                                                  wilson_lower_bound=0.1, errored=1))
    with Store(built.db) as store:
        run_id = data.runs_page(store, agent=NO_RETRY).rows[0]["trajectory_id"]
        agent = next(c.agent for c in cert.cells if c.agent.startswith(NO_RETRY + "@"))
        cert = _with_cell(cert, agent, gate_lower=0.0, gate_upper=0.8, gate_method="betting_cs", exposed=1, errored=1, tasks=1,
                          pass_k=PassK(k=3, value=0.25), flip_rate=0.5, errored_runs=(RunReason(run_id, SCRIPT),),
                          pass_k_curve=(PassKPoint(k=1, estimate=0.6, lower=0.3, upper=0.8, tasks=4),
                                        PassKPoint(k=3, estimate=0.25, lower=0.05, upper=0.6, tasks=4)))
        doc = parse(report_html(store, cert, "test"))
    headline = text_of(doc.find(".//h:section[@id='headline']", _NS))
    assert "(betting_cs)" in headline and "lower bound over runs (as if independent), for comparison: 10.0%" in headline
    cells = text_of(doc.find(".//h:section[@id='cells']", _NS))
    assert "pass^1 60.0% → pass^3 25.0%" in cells, "pass^k as a curve, its ends in words"
    curves = doc.findall(".//h:section[@id='cells']//{http://www.w3.org/2000/svg}svg[@class='passk']", _NS)
    assert sorted(len(c.findall(".//{http://www.w3.org/2000/svg}circle")) for c in curves)[-1] == 2, "a point per k" and "50.0%" in cells and "[0.0%, 80.0%] betting_cs" in cells
    assert f"({SCRIPT})" in cells, "an errored run's reason is shown, as text"
    link = next(a for a in doc.find(".//h:section[@id='cells']", _NS).iter("{http://www.w3.org/1999/xhtml}a"))
    target = doc.find(f".//*[@id='{link.get('href')[1:]}']", _NS)
    assert target is not None and run_id in text_of(target), "the errored run is embedded and linked"


def test_terminal_output_cannot_be_steered_by_trace_values() -> None:
    from plumbline_otel.report.terminal import diff_text, run_text

    hostile = Step("tool_call", "clear\x1b[2J", {"note": "\x1b]0;title\x07 line\nbreak"}, error="\x1b[31mfake")
    a, b = _run("A", hostile), _run("B", Step("tool_call", "other"))
    out = run_text(a, [{"invariant_id": "X\x1b[1m", "severity": "critical", "step_index": 0, "detail": "\x1b[0m"}]) + diff_text(diff_runs(a, b))
    for sequence in ("\x1b[2J", "\x1b]0;", "\x07", "\x1b[31mfake", "X\x1b[1m"):
        assert sequence not in out
    assert "clear?[2J" in out, "the name is shown, its escape character made harmless"


def test_a_run_page_says_how_to_replay_it_from_each_step_and_why_not_past_a_gap(tmp_path: Path) -> None:
    from plumbline_otel.replay.tape import replay_from_here
    from plumbline_otel.report.pages import file_href, run_page

    run = Trajectory("r1", "r1", "INV-7", "attribute:session.id", "ap-agent", None, None, "pay INV-7", "paid", (), (
        Step("llm_call", "m", result="looking it up", model="m"), Step("tool_call", "lookup", {"id": "INV-7"}, result={"ok": True}),
        Step("llm_call", "m", result="paying", model="m"), Step("tool_call", "pay", {"id": "INV-7"}),  # its result not captured
        Step("llm_call", "m", result="done", model="m")))
    with Store(tmp_path / "s.duckdb") as store:
        doc = parse(run_page(store, run, file_href({}), branch=replay_from_here(run, store.file_path())))
    section = doc.find(".//*[@data-testid='replay-from-here']", _NS)
    assert section is not None
    commands = [text_of(c) for c in section.iterfind(".//*[@data-testid='branch-command']", _NS)]
    # steps 1-4 can be branched at (step 4's own result is what the fault replaces); step 5's prefix lacks pay's result
    assert [c.split("--branch-at ")[1].split()[0] for c in commands] == ["1", "2", "3", "4"]
    assert all(f"--db {tmp_path / 's.duckdb'}" in c and "--task INV-7" in c and "--agent ap-agent" in c for c in commands)
    assert "--perturbations tool_fault" in commands[1] and "--perturbations model_fault" in commands[0]
    assert "step 4 (pay) has no recorded result" in text_of(section)
