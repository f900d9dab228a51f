"""The console `plumbline serve` answers under /: the same pages, read-only, behind the token, never in ingest's way."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from pages_support import (
    NO_RETRY,
    RETRY_FAULT,
    SCRIPT,
    TOKEN,
    WITH_RETRY,
    Built,
    Served,
    assert_self_contained,
    build_store,
    free_port,
    parse,
    serve,
    text_of,
)
from waits import EVENT_DEADLINE_S, wait_for

_NS = {"h": "http://www.w3.org/1999/xhtml"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("console"))


@pytest.fixture
def served(built: Built, tmp_path: Path) -> Iterator[Served]:
    db = tmp_path / "served.duckdb"
    shutil.copy(built.db, db)
    s = serve(db, built.cert)
    try:
        yield s
    finally:
        s.server.stop()


def test_pages_need_the_token_like_the_api(served: Served) -> None:
    for path in ("/", "/runs", "/diff?task=INV-1001&vs=x"):
        assert served.get(path, token=None).status_code == 401
        assert served.get(path, token="wrong").status_code == 401


def test_overview_shows_certificate_violations_coverage_and_links_a_diff(served: Served, built: Built) -> None:
    page = served.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src" not in page.headers["content-security-policy"] and "default-src 'none'" in page.headers["content-security-policy"]
    assert_self_contained(page.text)
    doc = parse(page.text)
    cert = json.loads(built.cert.read_text())
    assert text_of(doc.find(".//*[@data-testid='headline']", _NS)) == f"{cert['headline']['verdict']} at least {100 * cert['headline']['lower_bound']:.1f}%"
    assert doc.findall(".//h:tr[@class='violation']", _NS) and doc.find(".//h:section[@id='coverage']", _NS) is not None
    diff_links = [a.get("href") for a in doc.findall(".//h:section[@id='diffs']//h:a", _NS)]
    assert any("task=INV-1001" in href for href in diff_links)
    retry = next(href for href in diff_links if "task=INV-1001" in href)
    diff = served.get(retry)
    assert diff.status_code == 200
    first = [tr for tr in parse(diff.text).iter("{http://www.w3.org/1999/xhtml}tr") if "first-divergence" in (tr.get("class") or "")]
    assert len(first) == 1 and "check_duplicate" in text_of(first[0])


def test_runs_are_paged_and_each_opens(served: Served) -> None:
    page = served.get("/runs")
    doc = parse(page.text)
    links = [a.get("href") for a in doc.findall(".//h:td[@class='request']/h:a", _NS)]
    assert len(links) == 4
    run = served.get(links[0])
    assert run.status_code == 200 and "<table class=\"steps\">" in run.text
    assert served.get("/runs?page=9").status_code == 200
    assert served.get("/runs/does-not-exist").status_code == 404
    assert served.get("/runs?page=x").status_code == 400
    assert served.get("/runs?sort=nonsense").status_code == 400 and served.get("/runs?status=nonsense").status_code == 400
    assert served.get("/runs?page=-3").status_code == 200
    assert served.get("/nowhere").status_code == 404


def test_hostile_values_are_text_in_served_pages(served: Served) -> None:
    doc = parse(served.get("/runs").text)
    rows = doc.findall(".//h:tbody/h:tr", _NS)
    hostile = next(row.find(".//h:td[@class='request']/h:a", _NS).get("href") for row in rows if "<script>agent-a</script>" in text_of(row))
    page = served.get(hostile)
    assert SCRIPT in text_of(parse(page.text)) and "<script>" not in page.text


def test_spans_sent_to_serve_show_up_in_the_console(built: Built, tmp_path: Path) -> None:
    s = serve(tmp_path / "fresh.duckdb")
    try:
        assert "0 runs" in s.get("/").text
        for line in (RETRY_FAULT / "plan_execute.otlp.jsonl").read_text().splitlines():
            assert httpx.post(s.url + "/v1/traces", content=line, timeout=EVENT_DEADLINE_S,
                              headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # The run appears once assembled (every 0.1 s): the wait ends then, its deadline only bounds a hang.
        wait_for(lambda: NO_RETRY in s.get("/runs").text, f"{NO_RETRY} on /runs")
    finally:
        s.server.stop()


def test_a_slow_page_never_blocks_ingest(served: Served) -> None:
    """A read holding the console's connection for as long as it likes: spans are still acknowledged."""
    assert served.server.http is not None and served.server.http.console is not None
    console = served.server.http.console
    started, failed = threading.Event(), []

    def slow_read() -> None:
        with console._lock:  # what a page holds while it renders
            started.set()
            try:
                console._connection.execute("SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b").fetchall()
            except duckdb.Error as exc:  # interrupted below
                failed.append(exc)

    reader = threading.Thread(target=slow_read)
    reader.start()
    assert started.wait(EVENT_DEADLINE_S), "the read never took the console's lock"
    time.sleep(0.2)  # the read is inside its query by now; it holds the lock however long the post below takes
    line = (RETRY_FAULT / "plan_execute_retry.otlp.jsonl").read_text().splitlines()[0]
    posted = httpx.post(served.url + "/v1/traces", content=line, timeout=EVENT_DEADLINE_S,
                        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    still_reading = reader.is_alive()
    console._connection.interrupt()
    reader.join(EVENT_DEADLINE_S)
    assert posted.status_code == 200
    assert still_reading, "the read was still running when the spans were committed and acknowledged"


def test_report_and_show_against_a_running_server(built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from plumbline_otel.cli.main import cli

    db = tmp_path / "held.duckdb"
    shutil.copy(built.db, db)
    grpc_port = free_port()
    s = serve(db, grpc_port=grpc_port)
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", TOKEN)
    try:
        out = tmp_path / "served.html"
        result = CliRunner().invoke(cli, ["report", "--server", f"127.0.0.1:{grpc_port}", "--cert", str(built.cert), "--out", str(out)])
        assert result.exit_code == 0, result.output
        html = out.read_text()
        assert_self_contained(html)
        doc = parse(html)
        coverage = text_of(doc.find(".//h:section[@id='coverage']", _NS))
        with duckdb.connect(str(built.db), read_only=True) as connection:
            spans = connection.execute("SELECT count(*) FROM spans").fetchall()[0][0]
        assert str(spans) in coverage, "coverage comes from the server's store, spans and all"
        assert any("first-divergence" in (tr.get("class") or "") for tr in doc.iter("{http://www.w3.org/1999/xhtml}tr"))
        shown = CliRunner().invoke(cli, ["show", "--server", f"127.0.0.1:{grpc_port}", "--task", "INV-1001", "--vs", WITH_RETRY])
        assert shown.exit_code == 0, shown.output
        assert sum(line.startswith(">>") for line in shown.output.splitlines()) == 1
    finally:
        s.server.stop()


def test_overview_does_not_wait_for_slow_figures_and_shutdown_interrupts_them(built: Built, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Coverage scans the whole store (a minute and more at a million spans): pages go on without it."""
    from plumbline_otel.report import console as console_module
    from plumbline_otel.report.console import Console

    def endless_coverage(store):
        store.connection.cursor().execute("SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b").fetchall()
        return {}

    monkeypatch.setattr(console_module, "coverage_report", endless_coverage)
    db = tmp_path / "slow.duckdb"
    shutil.copy(built.db, db)
    root = duckdb.connect(str(db))
    console = Console(root.cursor(), str(db), slow_wait=0.2)
    started = time.monotonic()
    status, page = console.handle("/", "")
    again = console.handle("/", "")
    # Told apart from waiting for the figures: the endless query (10^12 rows) takes far longer than 120 s on any machine.
    assert status == 200 and again[0] == 200 and time.monotonic() - started < 120
    assert "Being computed" in text_of(parse(page).find(".//h:section[@id='coverage']", _NS))
    assert console.handle("/runs", "")[0] == 200, "other pages answer while it runs"
    closing = time.monotonic()
    console.close()
    assert time.monotonic() - closing < 120  # interrupted, not run to its end (far beyond 120 s)
    root.close()
