"""Progress on a terminal (issue 31 item 5): long commands draw a progress line on stderr when it is a
terminal, a real pseudo-terminal here, and nothing of it reaches a pipe, `--quiet` or JSON output."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from corpus import build_requests

from plumbline_otel.cli import progress as progress_module
from plumbline_otel.cli.progress import Progress

_CLEAR = b"\r\x1b[K"
_COLUMNS = 100
_SPEC = "version: 1\nname: toy\ninvariants:\n  - {id: LOOKUP, severity: critical, must_call: lookup}\n"


def _terminal(columns: int = _COLUMNS) -> tuple[int, int]:
    """A pseudo-terminal pair, `columns` wide: the side a command writes to, and the side read here."""
    controller, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return controller, side


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer closed its side
            return out
        if not chunk:
            return out
        out += chunk


ROOT = Path(__file__).resolve().parents[2]


def _plumbline(*args: str, stderr_terminal: bool, cwd: Path) -> tuple[int, bytes, bytes]:
    """Run the real command in a subprocess: stdout always a pipe, stderr a pseudo-terminal or a pipe."""
    command = [sys.executable, "-m", "plumbline_otel.cli.main", *args]
    if not stderr_terminal:
        done = subprocess.run(command, cwd=cwd, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
        return done.returncode, done.stdout, done.stderr
    controller, side = _terminal()
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=side, stdin=subprocess.DEVNULL,
                             env={**os.environ, "COLUMNS": str(_COLUMNS)})
    os.close(side)
    terminal: list[bytes] = []
    reader = threading.Thread(target=lambda: terminal.append(_read_all(controller)))  # until the child's side closes
    reader.start()
    stdout, _ = child.communicate(timeout=300)  # drained meanwhile: a full pipe would stop the child
    reader.join(timeout=30)
    os.close(controller)
    return child.returncode, stdout, terminal[0]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60,000 generated spans in two protobuf files: an ingest that lasts seconds, long enough to show progress."""
    folder = tmp_path_factory.mktemp("progress")
    requests = list(build_requests(60_000))
    for i, half in enumerate((requests[: len(requests) // 2], requests[len(requests) // 2:])):
        with open(folder / f"part{i}.otlp.pb", "wb") as out:
            for r in half:
                body = r.SerializeToString()
                out.write(len(body).to_bytes(4, "big") + body)
    return folder


def _progress_lines(terminal: bytes) -> list[str]:
    """The progress lines drawn (each starts by clearing the line it is drawn on)."""
    return [part.split(b"\r\n")[0].decode() for part in terminal.split(_CLEAR)[1:] if part.strip()]


@pytest.mark.slow
def test_ingest_and_certify_show_progress_on_a_terminal_only(traces: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    code, stdout, terminal = _plumbline("ingest", str(traces), "--db", db, "--workers", "0", stderr_terminal=True, cwd=tmp_path)
    assert code == 0, terminal.decode(errors="replace")
    lines = _progress_lines(terminal)
    assert any(re.search(r"^ingesting  \[#+ *\] +\d+%  [\d.]+ MB/[\d.]+ MB  \d+s", line) for line in lines), lines
    assert all(len(line) < _COLUMNS for line in lines), "a progress line fits the terminal"
    assert terminal.rstrip(b" ").endswith(_CLEAR), "the progress line is erased when the command is done"
    assert b"\x1b" not in stdout and b"\r" not in stdout and b"spans" in stdout, "stdout holds only the summary"

    (tmp_path / "spec.yaml").write_text(_SPEC)
    code, stdout, terminal = _plumbline("certify", "--spec", "spec.yaml", "--db", db, "--out", "cert.json",
                                        stderr_terminal=True, cwd=tmp_path)
    assert code == 0, terminal.decode(errors="replace")
    assert any(re.search(r"^certifying  \[#* *\] +\d+%  [\d,]+ runs/[\d,]+ runs", line) for line in _progress_lines(terminal)), terminal
    assert b"\x1b" not in stdout

    code, stdout, terminal = _plumbline("certify", "--spec", "spec.yaml", "--db", db, "--out", "cert.json", "--format", "json",
                                        stderr_terminal=True, cwd=tmp_path)
    assert code == 0 and _CLEAR not in terminal, "no progress beside JSON output"
    assert stdout.lstrip().startswith(b"{")


@pytest.mark.slow
def test_piped_or_quiet_output_has_no_progress(traces: Path, tmp_path: Path) -> None:
    code, stdout, stderr = _plumbline("ingest", str(traces), "--db", str(tmp_path / "a.duckdb"), "--workers", "0",
                                      stderr_terminal=False, cwd=tmp_path)
    assert code == 0 and stderr == b"", stderr  # not even a label
    assert b"\r" not in stdout and b"\x1b" not in stdout
    code, _, terminal = _plumbline("ingest", str(traces), "--db", str(tmp_path / "b.duckdb"), "--workers", "0", "--quiet",
                                   stderr_terminal=True, cwd=tmp_path)
    assert code == 0 and terminal == b"", terminal


@pytest.mark.slow
def test_replay_draws_its_progress_under_its_line_per_trial(tmp_path: Path) -> None:
    """A real replay of the toy agent (0.4 s a run): each trial's line stays, the progress line is drawn below them."""
    from replay.toy import traffic_store

    db = traffic_store(tmp_path, n=3)
    args = ["replay", "--db", str(db), "--study", "watched", "--agent", "toy-agent", "--perturbations", "baseline", "--repeats", "2",
            "--adapter", "python:tests.replay.toy:ToyAgent", "--adapter-option", "seconds=0.4", "--otlp-file", str(tmp_path / "r.jsonl")]
    code, stdout, terminal = _plumbline(*args, stderr_terminal=True, cwd=ROOT)
    assert code == 0, terminal.decode(errors="replace")
    text = terminal.decode()
    trials = re.findall(r"\[(\d)/6\] ok ", text)
    assert trials == [str(i) for i in range(1, 7)], text  # every trial's line, once, in order
    assert re.search(r"\x1b\[Kreplaying  \[#+ *\] +\d+%  \d trials/6 trials", text), text
    assert b"\x1b" not in stdout and b"ran 6 (6 ok" in stdout
    code, _, piped = _plumbline(*args, "--study", "piped", stderr_terminal=False, cwd=ROOT)
    assert code == 0 and b"\x1b" not in piped and b"\r" not in piped and len(re.findall(rb"\[\d/6\] ok ", piped)) == 6


def test_notes_stay_above_the_line_and_redraws_are_rate_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    """replay's line per trial goes above the progress line; a thousand updates draw a handful of times."""
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    # A redraw interval no loaded machine's loop of a thousand updates outlasts (0.25 s sometimes was).
    monkeypatch.setattr(progress_module, "INTERVAL", 30.0)
    controller, side = _terminal(60)
    with os.fdopen(side, "w", encoding="utf-8") as stream:
        with Progress("replaying", 4, "trials", stream=stream) as progress:
            progress.update(1)
            progress.note("[1/4] ok      trial-1  0.10s")
            started = time.monotonic()
            for i in range(1000):
                progress.update(1 + i / 1000)
            assert time.monotonic() - started < 30.0  # the loop itself outran the redraw interval
            progress.note("[2/4] ok      trial-2  0.10s")
    terminal = _read_all(controller)
    os.close(controller)
    text = terminal.decode()
    assert text.count("trial-1") == 1 and text.count("trial-2") == 1
    assert "\x1b[K[1/4] ok      trial-1  0.10s\r\n\r\x1b[Kreplaying  [#####" in text  # cleared, noted, drawn again
    assert terminal.count(_CLEAR) <= 6, terminal  # first draw, twice around each note, the end: not a thousand
    assert all(len(line) < 60 for line in _progress_lines(terminal))


def test_nothing_is_drawn_off_a_terminal_or_when_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    controller, side = _terminal()
    with open(tmp_path / "log", "w", encoding="utf-8") as log, os.fdopen(side, "w", encoding="utf-8") as stream:
        for progress in (Progress("x", 10, stream=log), Progress("x", 10, quiet=True, stream=stream)):
            with progress:
                progress.update(5)
                time.sleep(progress_module.INTERVAL)
                progress.update(6)
        Progress("x", stream=log).note("a line that stays")
    assert (tmp_path / "log").read_text() == "a line that stays\n"
    assert _read_all(controller) == b""  # the terminal's side is closed: all that was written to it is there
    os.close(controller)
