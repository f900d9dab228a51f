"""The live console: the report's pages served read-only by `plumbline serve` under `/`.

    /                       overview: certificate (when one is configured), violations, coverage, diffable tasks
    /runs?page=&agent=&task=&perturbation=&study=&status=&invariant=&q=&sort=&order=
                            runs (never the replay driver's records): status, request, agent, task,
                            perturbation, study, duration, tokens, cost; filtered, sorted, paged
    /runs/<id>              one run: span waterfall, messages, steps, violations where they broke, a diff link
    /diff?a=<id>&b=<id>     two runs side by side
    /diff?task=K&vs=AGENT[&agent=A][&perturbation=P]   the same, chosen by task
    /replays, /replays/<id>  replays started from a run's page ("replay from here"), each with its state and output
    POST /runs/<id>/replay  start one (step=K[&perturbation=P]): only when serve turned the console's replay on
                            (`replay.branch`, behind serve's token); a form post answers 303 to the replay's page

The console reads through a DuckDB connection of its own (a cursor of the writer's database):
it sees what has been committed and never queues behind ingest, and ingest never waits for a
page. Page requests are served one at a time on that connection. The overview's coverage figures
scan the store, so the overview is kept for `overview_ttl` seconds.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import duckdb

from plumbline_otel.coverage import coverage_report
from plumbline_otel.errors import PlumblineError
from plumbline_otel.model import Trajectory
from plumbline_otel.report import data
from plumbline_otel.report.html import chart_rows, render
from plumbline_otel.report.model import Certificate
from plumbline_otel.report.pages import advice, diff_page, run_page, spec_violations
from plumbline_otel.store import Reader, RunFilters

log = logging.getLogger("plumbline.console")
PREFIXES = ("/runs", "/diff", "/replays")
_REPLAY_POST = re.compile(r"^/runs/([^/]+)/replay$")
_FORM = "application/x-www-form-urlencoded"


def console_href(kind: str, **params: Any) -> str:
    """Links between console pages."""
    if kind == "run":
        return "/runs/" + quote(str(params["id"]), safe="")
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    if kind == "runs":
        return "/runs" + (f"?{query}" if query else "")
    return "/diff?" + query  # "diff" (a, b) and "task_diff" (task, vs, ...)


def is_console_path(path: str) -> bool:
    """True for the paths the console answers."""
    return path == "/" or any(path == p or path.startswith(p + "/") for p in PREFIXES)


class Console:
    """Renders console pages from `connection` (a cursor of the store's database); `handle(path, query)` gives (HTTP status, HTML)."""

    def __init__(self, connection: Any, source: str, certificate: str | Path | None = None, slow_ttl: float = 60.0,
                 slow_wait: float = 3.0, api: str | None = None, token: bool = False, check_spec: str | None = None,
                 branch_view: Callable[[Trajectory, str | None], dict[str, Any]] | None = None,
                 replay: Any | None = None, replay_note: str | None = None) -> None:
        self._connection, self._source, self._certificate = connection, source, certificate
        self._store = Reader(connection)
        self._api, self._token, self._check_spec = api, token, check_spec
        self._branch_view = branch_view  # "replay from here" on a run's page (`replay.tape.replay_from_here`)
        # Starting those replays (`replay.branch.ConsoleReplay`), when serve turned it on; else why it is off.
        self._replay, self._replay_note = replay, replay_note
        self._lock = threading.Lock()
        self._ttl, self._wait = slow_ttl, slow_wait
        self._slow: tuple[float, dict[str, Any]] | None = None  # (when, {"coverage": ..., "candidates": ...})
        self._worker: threading.Thread | None = None
        self._worker_cursor: Any = None

    @staticmethod
    def answers(path: str) -> bool:
        """True for the paths the console serves."""
        return is_console_path(path)

    def handle(self, path: str, query: str) -> tuple[int, str]:
        """Answer one GET; errors become an error page, never an exception."""
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            with self._lock:
                return self._route(path, params)
        except PlumblineError as exc:
            return self._error(400, str(exc))
        except ValueError as exc:
            return self._error(400, f"bad request: {exc}")
        except duckdb.Error as exc:
            log.warning("console page %s failed: %s", path, exc)
            return self._error(500, f"the store could not answer: {exc}")

    def _route(self, path: str, params: dict[str, str]) -> tuple[int, str]:
        if path == "/":
            return 200, self._overview_page()
        if path == "/runs":
            number = max(0, int(params.get("page", 0) or 0))
            filters = RunFilters.of(params)
            page = data.runs_page(self._store, number, filters=filters)
            return 200, render("runs.html", console_href, page=page, filters=filters, kept=filters.params(),
                               choices=self._store.filter_choices(), how=self._advice())
        if path.startswith("/runs/"):
            run = self._store.load_run(unquote(path[len("/runs/"):]))
            if run is None:
                return self._error(404, "no stored run with that id")
            branch = self._branch_view(run, self._store.file_path()) if self._branch_view is not None else None
            if branch is not None:
                branch = {**branch, "start": self._replay is not None, "note": self._replay_note,
                          "action": console_href("run", id=run.trajectory_id) + "/replay"}
            return 200, run_page(self._store, run, console_href, how=self._advice(), branch=branch)
        if path == "/replays" or path.startswith("/replays/"):
            return self._replays(unquote(path[len("/replays/"):]) if path.startswith("/replays/") else None)
        if path == "/diff":
            return self._diff(params)
        return self._error(404, f"no such page {path}")

    def _diff(self, params: dict[str, str]) -> tuple[int, str]:
        if "task" in params and "vs" in params:
            pair = data.pair_on_task(self._store, params["task"], params["vs"], params.get("agent"), params.get("perturbation"))
            if pair is None:
                return self._error(404, "no two runs on that task share a perturbation and variant")
            return 200, diff_page(self._store, *pair, console_href)
        if "a" in params and "b" in params:
            a, b = self._store.load_run(params["a"]), self._store.load_run(params["b"])
            if a is None or b is None:
                return self._error(404, "no stored run with that id")
            return 200, diff_page(self._store, a, b, console_href)
        return self._error(400, "a diff takes ?a=RUN&b=RUN or ?task=K&vs=AGENT")

    def _replays(self, job_id: str | None) -> tuple[int, str]:
        """The replays started from the console, or one of them: state, command, output, where its files are."""
        if self._replay is None:
            return self._error(404, f"the console's replay is {self._replay_note or 'off'}")
        jobs = [j.as_dict() for j in self._replay.jobs()] if job_id is None else None
        job = self._replay.job(job_id) if job_id is not None else None
        if job_id is not None and job is None:
            return self._error(404, f"no replay {job_id} was started here")
        runs = []
        if job is not None and job.returncode is not None:  # its runs, in serve's store once taken in: each beside the original
            runs = [{"id": r["trajectory_id"], "perturbation": r["perturbation"], "status": r.get("status"),
                     "diff": console_href("diff", a=job.run_id, b=r["trajectory_id"])}
                    for r in data.runs_page(self._store, 0, filters=RunFilters(study=job.study)).rows]
        return 200, render("replays.html", console_href, jobs=jobs, job=job.as_dict() if job is not None else None, runs=runs)

    @staticmethod
    def answers_post(path: str) -> bool:
        """True for the one path the console takes a POST on: starting a replay from a run's page."""
        return _REPLAY_POST.match(path) is not None

    def handle_post(self, path: str, body: bytes, headers: Any) -> tuple[int, str, bytes, dict[str, str]]:
        """Start a replay from a run's step (``step``, optional ``perturbation``: JSON or a form); (status, media type,
        body, headers). Serve checked the bearer token before this; a browser's cross-site post is refused here (its
        ``Origin`` or ``Sec-Fetch-Site`` says another site), so a page elsewhere cannot start one with a proxy's token."""
        import orjson

        def answer(status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> tuple[int, str, bytes, dict[str, str]]:
            return status, "application/json", orjson.dumps(payload), extra or {}

        matched = _REPLAY_POST.match(path)
        if matched is None:
            return answer(404, {"error": f"no such path {path}"})
        if self._replay is None:
            return answer(403, {"error": f"the console's replay is {self._replay_note or 'off'}"})
        origin, site, host = headers.get("Origin"), headers.get("Sec-Fetch-Site"), headers.get("Host")
        if (site is not None and site not in ("same-origin", "none")) or (origin and urlsplit(origin).netloc != host):
            return answer(403, {"error": "a replay is started from this console's own pages, not from another site"})
        media = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if media == "application/json":
                params = orjson.loads(body)
                if not isinstance(params, dict):
                    raise ValueError("the body is not a JSON object")
            elif media == _FORM:
                params = {k: v[-1] for k, v in parse_qs(body.decode("utf-8")).items()}
            else:
                return answer(415, {"error": f"send application/json or {_FORM}, not {media or 'no Content-Type'}"})
            step = int(str(params.get("step")))
            perturbation = params.get("perturbation") or None
        except (ValueError, TypeError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
            return answer(400, {"error": f"bad request: give step=K (and perturbation=P): {exc}"})
        with self._lock:
            run = self._store.load_run(unquote(matched.group(1)))
        if run is None:
            return answer(404, {"error": "no stored run with that id"})
        try:
            job = self._replay.start(run, step, None if perturbation is None else str(perturbation))
        except ValueError as exc:  # the run cannot be branched there (TapeError), or replays are busy
            return answer(409, {"error": str(exc)})
        href = "/replays/" + quote(job.id, safe="")
        if media == _FORM:
            return 303, "text/plain; charset=utf-8", f"started: {href}\n".encode(), {"Location": href}
        return answer(202, {"job": job.as_dict(), "href": href}, {"Location": href})

    def _advice(self) -> dict[str, Any]:
        return advice(self._store, self._source, api=self._api, served=True, token=self._token, check_spec=self._check_spec)

    def _overview_page(self) -> str:
        cert, stored = self._load_certificate(), False
        if cert is None:
            cert, stored = data.latest_certificate(self._store), True
        slow = self._slow_figures()
        return render("console.html", console_href, source=self._source, totals=self._store.totals(),
                      cert=cert, stored_cert=stored and cert is not None, chart=chart_rows(cert) if cert else [],
                      violations=spec_violations(self._store, cert), how=self._advice(),
                      coverage=slow.get("coverage"), candidates=slow.get("candidates"))

    def _slow_figures(self) -> dict[str, Any]:
        """Coverage and diffable tasks: fresh if they can be had within `slow_wait`, else the last ones (or {})."""
        stale = self._slow is None or time.monotonic() - self._slow[0] > self._ttl
        if stale and (self._worker is None or not self._worker.is_alive()):
            self._worker_cursor = self._connection.cursor()
            self._worker = threading.Thread(target=self._compute_slow, args=(self._worker_cursor,), name="plumbline-console", daemon=True)
            self._worker.start()
            self._worker.join(self._wait)  # only the request that started it waits
        return self._slow[1] if self._slow is not None else {}

    def _compute_slow(self, cursor: Any) -> None:
        try:
            one = Reader(data.OneCursor(cursor), self._store.schema_version)
            figures = {"coverage": coverage_report(one), "candidates": one.diff_candidates()}
        except Exception:  # interrupted at shutdown, or the store went away: keep the last figures
            return
        finally:
            cursor.close()
        self._slow = (time.monotonic(), figures)

    def _load_certificate(self) -> Certificate | None:
        """The configured certificate, re-read each time so a new `plumbline certify` shows at once."""
        if self._certificate is None:
            return None
        from plumbline_otel.report.render import load_certificate

        return load_certificate(self._certificate)

    def _error(self, status: int, message: str) -> tuple[int, str]:
        return status, render("error.html", console_href, status=status, message=message)

    def close(self) -> None:
        """Stop the replays still running, the background computation, and close the read connections."""
        if self._replay is not None:
            self._replay.close()
        deadline = time.monotonic() + 10
        while self._worker is not None and self._worker.is_alive() and time.monotonic() < deadline:
            self._worker_cursor.interrupt()  # a query may start after an interrupt: repeat until the thread ends
            self._worker.join(0.1)
        with self._lock:
            self._connection.close()


__all__ = ["Console", "console_href", "is_console_path"]
