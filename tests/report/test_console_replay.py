"""From the console (issue 44 item 5): "replay from here" on a run's page starts the replay, when serve was told the
agent to re-run (PLUMBLINE_CONSOLE_REPLAY_ADAPTER) and has a token. A real `plumbline serve` on 127.0.0.1 serves a
production run (the framework fixture `mcp_openai_agents`, content captured); a form post from the run's page starts
`plumbline replay --branch-at 3` as a subprocess (the OpenAI Agents SDK agent over MCP, its model the simulated
provider, its tools the counting tool server), whose page shows its state and output, and whose spans serve takes
into its store. Off by default: without the setting the page gives the command only and a post is refused."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from pages_support import TOKEN, parse, serve
from replay.mcp_ap_support import AGENT, ROOT, SERVER, production_runs, production_store, simulated_provider
from waits import EVENT_DEADLINE_S, wait_for

from plumbline_otel.replay.branch import ENV_ADAPTER, ENV_ARGS, ENV_DIR, ConsoleReplay
from plumbline_otel.replay.proxy.simulated import SimulatedProvider


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return production_store(tmp_path / "prod.duckdb")


def run_id(db: Path) -> str:
    """The INV-1001 task's latest run (the one `replay --task` takes as the task's source)."""
    return max(production_runs(db), key=lambda t: (t.start_ns, t.trajectory_id)).trajectory_id


def post(url: str, form: dict[str, str], token: str | None = TOKEN, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url, data=form, headers={**auth, **headers}, timeout=EVENT_DEADLINE_S, follow_redirects=False)


def get(url: str) -> httpx.Response:
    return httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=EVENT_DEADLINE_S)


provider = pytest.fixture(simulated_provider)


@pytest.mark.slow
def test_replay_from_here_starts_the_replay_and_shows_its_state(tmp_path: Path, db: Path, provider: SimulatedProvider,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "tools.jsonl"
    log.touch()
    monkeypatch.setenv(ENV_ADAPTER, AGENT)
    monkeypatch.setenv(ENV_ARGS, f"--upstream openai={provider.openai_url} --mcp-upstream '{sys.executable} {SERVER} {log}' "
                                 f"--adapter-option cwd={ROOT} --adapter-option timeout_s=600 --concurrency 1 --trace-wait 120 --grace 1")
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "jobs"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-real-key")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", TOKEN)  # the operator's shell has it: the replay (and its agent) must not
    run = run_id(db)
    served = serve(db)
    try:
        page = served.get(f"/runs/{run}").text
        parse(page)
        forms = re.findall(r'<form method="post" action="([^"]+)"[^>]*data-testid="branch-start"><input type="hidden" name="step" '
                           r'value="(\d+)"><input type="hidden" name="perturbation" value="(\w+)">', page)
        assert [(step, p) for _, step, p in forms] == [("1", "model_fault"), ("2", "tool_fault"), ("3", "model_fault"),
                                                       ("4", "tool_fault"), ("5", "model_fault"), ("6", "tool_fault"), ("7", "model_fault")]
        action = served.url + forms[2][0]
        assert post(action, {"step": "3", "perturbation": "model_fault"}, token=None).status_code == 401
        assert post(action, {"step": "3", "perturbation": "model_fault"}, token="wrong").status_code == 401
        cross = post(action, {"step": "3", "perturbation": "model_fault"}, Origin="http://elsewhere.example")
        assert cross.status_code == 403 and "another site" in cross.json()["error"]
        assert post(action, {"step": "3", "perturbation": "tool_fault"}).status_code == 409  # step 3 is a model response
        assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())  # nothing was started by those

        started = post(action, {"step": "3", "perturbation": "model_fault"}, Origin=served.url)
        assert started.status_code == 303, started.text
        job_page = served.url + started.headers["Location"]
        deadline = time.monotonic() + 2 * EVENT_DEADLINE_S  # a replay subprocess: the package import alone took 20 s at load 20
        while True:
            html = get(job_page).text
            state = re.search(r'data-testid="replay-state">(\w+)<', html)
            assert state is not None, html
            if state.group(1) != "running" or time.monotonic() > deadline:
                break
            time.sleep(1)
        parse(html)
        assert state.group(1) == "done", html
        assert "ran 1 (1 ok" in html and "--branch-at 3" in html and "model_fault@3" in html
        assert "export request(s) of its spans taken into the store" in html
        assert [line for line in log.read_text().splitlines() if "lookup_invoice" in line] == []  # step 2 came from the tape
        assert len(provider.requests) == 3  # the faulted call's retry, then steps 5 and 7: the prefix was never sent
        study = re.search(r'data-testid="replay-study">([^<]+)<', html)
        assert study is not None
        # serve's store has the replay's run beside the original
        wait_for(lambda: "model_fault@3" in served.get(f"/runs?study={study.group(1)}").text, "the replay's run in serve's store")
        job_html = get(job_page).text  # and the replay's page links its run to the aligned diff against the original
        parse(job_html)
        diff = re.search(r'data-testid="replay-diff" href="([^"]+)"', job_html)
        assert diff is not None, job_html
        assert f"a={run}" in diff.group(1).replace("&amp;", "&")
        assert served.get(diff.group(1).replace("&amp;", "&")).status_code == 200
        assert started.headers["Location"] in served.get("/replays").text  # the list of replays started here
    finally:
        served.server.stop()


def test_without_the_setting_the_page_gives_the_command_and_a_post_is_refused(tmp_path: Path, db: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ADAPTER, raising=False)
    run = run_id(db)
    copy = tmp_path / "served.duckdb"
    shutil.copy(db, copy)
    served = serve(copy)
    try:
        page = served.get(f"/runs/{run}").text
        assert 'data-testid="branch-command"' in page and 'data-testid="branch-start"' not in page
        assert f"off: set {ENV_ADAPTER}" in page
        refused = post(f"{served.url}/runs/{run}/replay", {"step": "3"})
        assert refused.status_code == 403 and ENV_ADAPTER in refused.json()["error"]
        assert served.get("/replays").status_code == 404
    finally:
        served.server.stop()


def test_the_console_replay_needs_a_token_and_never_hands_it_on() -> None:
    launcher, note = ConsoleReplay.from_env({ENV_ADAPTER: "command:agent"}, "x.duckdb", token=False)
    assert launcher is None and "needs serve's bearer token" in note
    launcher, note = ConsoleReplay.from_env({ENV_ADAPTER: "command:agent"}, "x.duckdb", token=True)
    assert launcher is not None and note == "on"
    assert "PLUMBLINE_AUTH_TOKEN" not in ConsoleReplay("command:agent", "d", env={"PLUMBLINE_AUTH_TOKEN": "t", "PATH": "/bin"}).env
