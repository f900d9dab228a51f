"""Issue 39 item 10: runners on one host share one `--db`. A runner that finds the store held by another short-lived
reader (another runner sourcing its tasks) waits for it and goes on; a refusal names the real holder (its pid and
command line), never a guess; a server holding its file is refused at once, since it never lets go."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.sources import Sources
from plumbline_otel.store import Store, StoreLocked

HOLDER = """
import pathlib, sys, time
from plumbline_otel.store import Store
db, held, release = sys.argv[-3:]
store = Store(db)
pathlib.Path(held).touch()
deadline = time.monotonic() + 600  # held until released: this only bounds a test that never releases it
while not pathlib.Path(release).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
store.close()
"""


def _hold(db: Path, tmp: Path, *tag: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A process that holds ``db`` open for writing until ``release`` exists; returns once it holds it."""
    held, release = tmp / "held", tmp / "release"
    script = tmp / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), *tag, str(db), str(held), str(release)])
    deadline = time.monotonic() + EVENT_DEADLINE_S  # the wait ends when it holds the store: this only bounds a hang
    while not held.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder did not open the store"
        time.sleep(0.02)
    return proc, release


def test_a_refusal_names_the_real_holder(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    Store(db).close()
    proc, release = _hold(db, tmp_path, "plumbline-test-holder")
    try:
        with pytest.raises(StoreLocked) as refused:
            Store(db)
        message = str(refused.value)
        assert refused.value.pid == proc.pid and f"held by process {proc.pid}" in message
        assert "plumbline-test-holder" in message and "probably" not in message
        assert not refused.value.is_server and "wait for it" in message
    finally:
        release.touch()
        proc.wait(timeout=60)


def test_a_runner_waits_for_another_runner_s_read_and_goes_on(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.duckdb"
    Store(db).close()
    proc, release = _hold(db, tmp_path, "replay", "--db", str(db))
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(list(Sources([str(db)], assemble=True).trajectories()))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    said = ""
    deadline = time.monotonic() + 120
    while "waiting for it to let go" not in said:  # the reader found the store held and said whom it waits for
        assert time.monotonic() < deadline and not outcome, (said, outcome)
        said += capfd.readouterr().err
        time.sleep(0.02)
    assert f"process {proc.pid}" in said
    release.touch()
    reader.join(timeout=120)
    proc.wait(timeout=60)
    assert outcome == [[]], outcome  # it read the store once the other let go


def test_a_server_holding_the_store_is_not_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "t.duckdb"
    Store(db).close()
    monkeypatch.setenv("PLUMBLINE_STORE_WAIT_S", "600")
    proc, release = _hold(db, tmp_path, "plumbline", "serve", "--db", str(db))
    try:
        started = time.monotonic()
        with pytest.raises(StoreLocked) as refused:
            list(Sources([str(db)], assemble=True).trajectories())
        assert refused.value.is_server and "--server" in str(refused.value)
        assert time.monotonic() - started < 60  # refused, not waited out for 600 s
    finally:
        release.touch()
        proc.wait(timeout=60)
