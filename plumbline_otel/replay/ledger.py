"""The study ledger: JSON lines appended as things happen, the study's single source of truth.

Three kinds of row: an attempt starting (``status`` "started", with its ``attempt`` number, so
numbers are never reused even after a crash), an attempt's outcome (``status`` ok / errored /
missing, the same fields as the driver's record of it, `plumbline_otel.trials`), and spend rows
(``spend`` reserve / settle, written by ``budget.SpendCap`` under a file lock). Resume trusts it
besides the store: a trial with an attempt the agent ran (ok or errored) is decided and never
runs again; one whose attempts are all missing runs again. The variants file beside it lists
every variant built for the study, rejected ones with the guard's reason; ``study.json`` holds
the study state's random instance id.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import orjson

from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue, to_float, to_int


def append_line(path: Path, line: bytes) -> None:
    """Append one whole line with a single O_APPEND write, so a crash never leaves half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class Ledger:
    """Append-only JSONL; the last row of a trial wins. Thread-safe within a process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.rows: list[JsonObject] = []
        self.reload()

    def reload(self) -> None:
        """Re-read the file (another process may have appended since)."""
        self.rows = list(read_jsonl(self.path.read_bytes().splitlines())) if self.path.exists() else []

    def latest(self) -> dict[str, JsonObject]:
        """The last outcome row per trial id."""
        return {str(row["trial_id"]): row for row in self.rows if "trial_id" in row and row.get("status") != "started"}

    def decided(self) -> set[str]:
        """Trials with an attempt the agent ran (ok or errored), or stopped by a sequential study: they never run again."""
        return {str(row["trial_id"]) for row in self.rows if "trial_id" in row and row.get("status") in ("ok", "errored", "stopped")}

    def spent_usd(self) -> float:
        """Settled spend of the study (``budget.SpendCap`` rows)."""
        return float(sum(to_float(row.get("usd") or 0.0) for row in self.rows if row.get("spend") == "settle"))

    def unfinished(self) -> dict[str, tuple[int, JsonValue]]:
        """trial id -> (attempt, pid) of its last attempt when that attempt started and no outcome
        followed it: its runner died mid-attempt."""
        last: dict[str, JsonObject] = {}
        for row in self.rows:
            if "trial_id" in row and "status" in row:
                last[str(row["trial_id"])] = row
        return {tid: (to_int(row.get("attempt") or 0), row.get("pid")) for tid, row in last.items() if row["status"] == "started"}

    def begin_attempt(self, trial_id: str) -> int:
        """Number and record the next attempt of ``trial_id`` (1, 2, …; never reused)."""
        with self._lock:
            attempt = 1 + max((to_int(r.get("attempt") or 0) for r in self.rows if r.get("trial_id") == trial_id), default=0)
            row: JsonObject = {"trial_id": trial_id, "attempt": attempt, "status": "started", "pid": os.getpid()}
            append_line(self.path, orjson.dumps(row) + b"\n")
            self.rows.append(row)
            return attempt

    def append(self, row: JsonObject) -> None:
        line = orjson.dumps(row, default=str) + b"\n"
        with self._lock:
            append_line(self.path, line)
            self.rows.append(row)


def read_jsonl(lines: Iterable[bytes]) -> Iterator[JsonObject]:
    """The JSON objects of an append-only JSON-lines file's lines; a blank line, or a torn last line a crash left, is
    skipped (every line before it is whole: each was written by one O_APPEND write)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            yield row


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, object]]) -> None:
    """Replace ``path`` with these rows (atomically; each writer through its own temporary file, so two
    runners opening one study at once cannot take each other's file away before the lock refuses one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        for row in rows:
            fh.write(orjson.dumps(row, default=str) + b"\n")
    os.replace(name, path)
