"""The report file and the served console in a real headless Chromium (Debian's /usr/bin/chromium).

Assertions are on the rendered page (visibility, layout boxes, computed styles, what scripts
could have done), not on the HTML source. Screenshots go to the test's temporary directory, and
those docs/ shows (`DOCS`) to $PLUMBLINE_SCREENSHOTS when set: `PLUMBLINE_SCREENSHOTS=docs` refreshes them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from demo_support import DemoRun
from pages_support import NO_RETRY, SCRIPT, TOKEN, WITH_RETRY, Built, build_store, serve

CHROMIUM = "/usr/bin/chromium"
# Said at once, before the demo and the stores these tests look at are built (minutes for nothing), and
# listed at the end of the run with its command (tests/conftest.py).
_NO_CHROMIUM = f"the browser tests drive Debian's Chromium and {CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run does)"
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=_NO_CHROMIUM)]
# What Chromium needs on a closed, GPU-less machine, as root: no sandbox, no background fetches.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions"]
RED = "rgb(179, 38, 30)"
# The screenshots docs/operating.md shows: the demo's report and a diff in it, one study's report, and the
# console's overview after `check --server`, its runs list and a run's page (the others are the tests' own).
DOCS = {"report.png", "report-diff.png", "report-study.png", "console-checked.png", "console-runs.png", "console-run.png"}


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(_NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("browser"))


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def save(page: Any, shots: Path, name: str, **options: Any) -> Path:
    path = shots / name
    page.screenshot(path=str(path), **options)
    if os.environ.get("PLUMBLINE_SCREENSHOTS") and name in DOCS:
        target = Path(os.environ["PLUMBLINE_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / name)
    return path


def watch(page: Any) -> dict[str, list[str]]:
    """Every request the page makes and every script error it raises."""
    seen: dict[str, list[str]] = {"requests": [], "errors": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    return seen


def assert_visible_essentials(page: Any, cert: dict[str, Any]) -> None:
    headline = page.get_by_test_id("headline")
    assert headline.is_visible()
    assert headline.inner_text() == f"{cert['headline']['verdict']} at least {100 * cert['headline']['lower_bound']:.1f}%"
    sentence = page.get_by_test_id("headline-sentence")
    assert sentence.is_visible() and sentence.inner_text().startswith(cert["headline"]["verdict"] + ":")
    assert "with 95% confidence" in sentence.inner_text(), "the headline says in words what the number is"
    if cert["headline"]["verdict"] != "PASS":
        assert page.get_by_test_id("why-not-pass").is_visible(), "and why the gate is not passed"
    assert page.locator("#headline .term").first.get_attribute("title"), "terms carry their gloss on hover"
    bars = page.locator("svg rect.bar")
    cells = sum(len(a["perturbations"]) for a in cert["agents"])
    assert bars.count() == 2 * cells
    for i in range(bars.count()):
        box = bars.nth(i).bounding_box()
        assert bars.nth(i).is_visible() and box is not None and box["width"] >= 1 and box["height"] >= 6
    example = page.locator("#violations .example a").first
    assert example.is_visible() and example.inner_text()


def assert_divergence_highlighted(page: Any) -> None:
    row = page.locator("tr.first-divergence").first
    row.scroll_into_view_if_needed()
    assert row.is_visible()
    flag = row.locator(".divergence-flag")
    assert flag.is_visible() and flag.inner_text() == "first divergence"
    assert row.evaluate("r => getComputedStyle(r.cells[0]).outlineColor") == RED
    assert "check_duplicate" in row.inner_text()


def test_report_file_in_chromium(browser: Any, built: Built, shots: Path) -> None:
    cert = json.loads(built.cert.read_text())
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    seen = watch(page)
    page.goto(built.report.as_uri())
    assert_visible_essentials(page, cert)
    save(page, shots, "report-fixture.png")
    diff = page.locator("section.diff-view", has_text=NO_RETRY).first
    assert diff.is_visible() and WITH_RETRY in diff.inner_text()
    assert_divergence_highlighted(page)
    save(page, shots, "report-fixture-diff.png")
    page.locator("#violations .example a").first.click()  # an in-file anchor: the run is right there
    target = page.evaluate("location.hash")
    assert target.startswith("#run-") and page.locator(target).is_visible()
    assert seen["requests"] == [built.report.as_uri()], "the file makes no request of its own"
    assert seen["errors"] == []
    save(page, shots, "report-full.png", full_page=True)


def test_hostile_trace_values_render_as_text(browser: Any, built: Built, shots: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(built.report.as_uri())
    shown = page.get_by_text(SCRIPT).first
    shown.scroll_into_view_if_needed()
    assert shown.is_visible(), "the script tag is on screen, as text"
    assert page.evaluate("window.__pwned") is None, "and nothing of it ran"
    assert page.locator("h1#owned").count() == 0 and page.locator("main img").count() == 0
    save(page, shots, "hostile.png")


def test_served_console_in_chromium(browser: Any, built: Built, shots: Path, tmp_path: Path) -> None:
    db = tmp_path / "served.duckdb"
    shutil.copy(built.db, db)
    served = serve(db, built.cert)
    try:
        anonymous = browser.new_page()
        assert anonymous.goto(served.url + "/").status == 401
        context = browser.new_context(viewport={"width": 1280, "height": 1000},
                                      extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
        page = context.new_page()
        seen = watch(page)
        page.goto(served.url + "/")
        assert_visible_essentials(page, json.loads(built.cert.read_text()))
        save(page, shots, "console.png")
        page.locator("#diffs a", has_text="INV-1001").click()
        page.wait_for_load_state()
        assert_divergence_highlighted(page)
        save(page, shots, "console-diff.png")
        page.get_by_role("link", name="runs").first.click()
        assert page.locator("table.runs tbody tr").count() == 4
        assert all(url.startswith(served.url) for url in seen["requests"]) and seen["errors"] == []
        assert page.evaluate("window.__pwned") is None
    finally:
        served.server.stop()


def test_console_runs_filters_run_page_and_check_through_the_server(browser: Any, built: Built, shots: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user clicks: the advice, a check --server run from it, filters, a run's waterfall and messages, the diff link."""
    import shlex

    from click.testing import CliRunner
    from pages_support import SPEC, free_port

    from plumbline_otel.cli.main import cli
    from plumbline_otel.ingest import ingest_files
    from plumbline_otel.store import Store

    db = tmp_path / "fresh.duckdb"
    with Store(db) as store:
        ingest_files(store, [str(Path(__file__).resolve().parents[1] / "report" / "retry_fault")])
    port = free_port()
    served = serve(db, grpc_port=port)
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", TOKEN)
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 1000},
                                      extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
        page = context.new_page()
        seen = watch(page)
        page.goto(served.url + "/")
        command = page.get_by_test_id("check-command")
        assert command.is_visible() and command.inner_text().endswith(f"--server 127.0.0.1:{port}")
        ran = CliRunner().invoke(cli, shlex.split(command.inner_text().replace("SPEC.yaml", str(SPEC)))[1:])
        assert ran.exit_code == 0, ran.output
        page.reload()
        assert page.locator("#violations tr.violation").count() >= 2, "violations show after check --server"
        save(page, shots, "console-checked.png")

        page.get_by_role("link", name="runs").first.click()
        page.get_by_test_id("filter-status").select_option("violating")
        page.get_by_test_id("apply-filters").click()
        page.wait_for_load_state()
        rows = page.locator("table.runs tbody tr")
        assert rows.count() == 1 and rows.first.get_attribute("data-status") == "violating"
        assert "AP-PAY-CLEAN" in rows.first.inner_text() and "Northwind" in rows.first.inner_text()
        save(page, shots, "console-runs.png")
        rows.first.locator("td.request a").click()
        page.wait_for_load_state()
        assert page.get_by_test_id("run-status").inner_text().startswith("violating")
        bars = page.locator("table.waterfall .wf-bar")
        assert bars.count() == 12
        widths = [bars.nth(i).bounding_box()["width"] for i in range(bars.count())]
        assert max(widths) > 200 and min(widths) >= 1, "the waterfall draws every span by its duration"
        llm = page.locator("table.waterfall tr.kind-llm_call").first
        llm.locator("summary").click()
        messages = llm.get_by_test_id("messages-in")
        assert messages.is_visible() and "Northwind" in messages.inner_text()
        broke = page.locator("table.waterfall tr.violated .violation-note").first
        broke.scroll_into_view_if_needed()
        assert broke.is_visible() and "broke here" in broke.inner_text()
        save(page, shots, "console-run.png", full_page=True)
        page.get_by_test_id("diff-link").click()
        page.wait_for_load_state()
        assert_divergence_highlighted(page)
        assert all(url.startswith(served.url) for url in seen["requests"]) and seen["errors"] == []
    finally:
        served.server.stop()


def test_one_study_s_report_in_chromium(browser: Any, shots: Path, tmp_path: Path) -> None:
    """A certificate of one study, over a store of two: every section of its report holds that study's runs only."""
    from click.testing import CliRunner
    from pages_support import TOY_SPEC, two_studies

    from plumbline_otel.cli.main import cli

    db, spec, cert, out = two_studies(tmp_path / "two.duckdb"), tmp_path / "toy.yaml", tmp_path / "clean.json", tmp_path / "clean.html"
    spec.write_text(TOY_SPEC)
    for args in (["certify", "--study", "clean", "--out", str(cert), "--format", "none"], ["report", "--cert", str(cert), "--out", str(out)]):
        done = CliRunner().invoke(cli, [*args, "--db", str(db), "--spec", str(spec)])
        assert done.exit_code == 0, done.output
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(out.as_uri())
    verdict = json.loads(cert.read_text())["headline"]["verdict"]
    assert page.get_by_test_id("headline").is_visible() and page.get_by_test_id("headline").inner_text().startswith(verdict)
    totals = page.get_by_test_id("totals")
    assert totals.is_visible() and "study clean only" in totals.inner_text() and "12 runs of 2 agent(s)" in totals.inner_text()
    assert page.locator("svg g.cell").count() == 2, "the chart's cells are the study's: agents a and b, baseline"
    assert page.locator("#violations tr.violation").count() == 0, "the broken study's violations are not this report's"
    assert page.locator("[id^='run-']").count() > 0 and "broken-" not in page.content(), "nor are its runs, in any section"
    save(page, shots, "report-study.png")


def test_demo_report_in_chromium(browser: Any, shots: Path, demo_run: DemoRun) -> None:
    """The report `plumbline demo` writes; its screenshots are docs/report*.png."""
    assert demo_run.result.exit_code == 0, demo_run.result.output
    assert f"9. Report: open {demo_run.report.resolve()}" in demo_run.result.output
    cert = json.loads(demo_run.certificate.read_text())
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    page.goto(demo_run.report.as_uri())
    assert_visible_essentials(page, cert)
    assert page.locator("svg g.cell.sets").count() >= 1, "the cell that sets the headline is marked"
    assert page.locator("svg text.tick-top").count() == 5, "the chart's axis is above its first row too"
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 12_000, f"long sections are folded (issue 31: 18,000 px and more): {height} px"
    assert page.locator("details.run-fold:not([open])").count() > 3, "the example runs are folded, each a line"
    save(page, shots, "report.png")
    first = page.locator("section.diff-view").first
    assert NO_RETRY in first.inner_text() and WITH_RETRY in first.inner_text() and "tool_fault" in first.inner_text()
    first.evaluate("s => s.scrollIntoView()")
    assert_divergence_highlighted(page)
    save(page, shots, "report-diff.png")
    page.locator("#violations .example a").first.click()  # a folded run is the link's target: its summary is in view
    target = page.evaluate("location.hash")
    assert target.startswith("#run-") and page.locator(target).is_visible()
    page.locator(f"{target} > summary").click()
    assert page.locator(f"{target} table.steps").is_visible(), "opened, the run's steps show"
