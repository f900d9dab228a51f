"""The store's DuckDB file: opening it (a writer's through ATTACH, with its row group size), sharing it, closing it, attaching it again.

One writer per file: a second process gets `StoreLocked`, which says how to ask the running server instead.
"""

from __future__ import annotations

import os
import re
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

import duckdb

from plumbline_otel.errors import StoreError

# Rows in a row group of a store opened for writing (DuckDB's default is 122,880). A checkpoint
# recompresses the group still being filled, and at the default that was up to 122,880 spans (~190
# MB of rows) each time: checkpoints of 0.06-0.45 s that stalled every commit, in `serve` too. At
# 16,384, writing 100,000 spans took 0.63-0.66 s of CPU instead of 1.04-1.06, the writer's peak
# memory fell from ~535 to ~370 MB and the file from 19 to 12 MB (best of 2 each; 32,768 was no better).
# A transaction that appends a whole row group is written by DuckDB straight into the file, compressed,
# rather than into the write-ahead log and again at the checkpoint: file ingest with workers commits
# whole row groups (`ingest.transaction_spans`). 5,000 spans put 8 MB into the log; 16,384 put 0.1 MB.
ROW_GROUP_SIZE = 16_384


_SERVE_HINT = "use --server HOST:PORT to ask the running server, or stop it first"
_READER_HINT = ("it holds the file only while it reads or writes it: wait for it (a `plumbline replay` waits for another "
                "one's short read by itself), or serve the store (`plumbline serve`) and give --server HOST:PORT")


def _command_of(pid: int) -> str | None:
    """The command line of process ``pid`` (Linux /proc), or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    if not words:
        return None
    text = " ".join(words)
    return text if len(text) <= 600 else text[:597] + "..."


def _holder_pid(message: str) -> int | None:
    """The pid DuckDB names as the holder of a file's lock ("Conflicting lock is held in … (PID 1234)")."""
    found = re.search(r"\(PID (\d+)\)", message)
    return int(found.group(1)) if found else None


class StoreLocked(StoreError):
    """Another process holds the file (a writer: `plumbline serve`, `ingest`, a replay sourcing its tasks; or a reader).

    ``pid`` and ``command`` name the holder as DuckDB and /proc report it (None when they do not), so the message says
    who really holds it rather than guessing, and a caller can tell a server (ask it) from a short-lived reader (wait)."""

    def __init__(self, path: str, pid: int | None = None, command: str | None = None) -> None:
        self.path, self.pid, self.command = path, pid, command
        if pid is None:
            who = "another process (DuckDB did not name it)"
        else:
            who = f"process {pid}" + (f" (`{command}`)" if command else "")
        super().__init__(f"the database {path} is held by {who}; {_SERVE_HINT if self.is_server else _READER_HINT}")

    @property
    def is_server(self) -> bool:
        """Whether the holder is a long-running server (`plumbline serve`), which never lets go of its file by itself."""
        return self.command is not None and bool(re.search(r"\bserve\b", self.command))


# A file open for writing in this process: the connection that attached it, and how many stores use it.
_attached: dict[str, tuple[Any, int]] = {}
_spares: dict[str, Any] = {}  # ... and its cursor on the spare database (`_connect`)
_SPARE = "plumbline_spare"
_attached_lock = threading.Lock()


def attaches(path: str, read_only: bool) -> bool:
    """Whether a store of `path` is a writer's attached file (`_connect`); in-memory stores are DuckDB's own, one each."""
    return not read_only and bool(path) and not path.startswith(":memory:")


def _connect(path: str, read_only: bool) -> Any:
    """A connection to the store's file: a writer's is a cursor of a database that attached it with `ROW_GROUP_SIZE`.

    The row group size is an option of ATTACH, not kept in the file, so a writer attaches the file
    to an in-memory database, makes it the default and detaches the in-memory one: every cursor
    then opens on the store, as with `duckdb.connect(path)`. An empty in-memory database `spare`
    is attached beside it, and one cursor kept on it (`_spares`): the one cursor that can still
    detach the file and attach it again when DuckDB has invalidated it (`reattach`; a cursor
    on the store cannot even change databases then). Stores of one file in one process share that database (as `duckdb.connect` shares one per
    path), each through its own cursor, and the last to close detaches it. DuckDB would spill to
    `.tmp` in the working directory for an in-memory database; the store's spills stay beside its file.
    """
    if not attaches(path, read_only):
        return duckdb.connect(path, read_only=read_only)
    key = os.path.realpath(path)
    with _attached_lock:
        if key in _attached:
            database, users = _attached[key]
            _attached[key] = (database, users + 1)
            return database.cursor()
        database = duckdb.connect()
        quoted = path.replace("'", "''")
        try:
            database.execute(_ATTACH.format(path=quoted))
            database.execute("USE store")
            database.execute("DETACH memory")
            database.execute(f"SET temp_directory = '{quoted}.tmp'")
            database.execute(f"ATTACH ':memory:' AS {_SPARE}")
            spare = database.cursor()
            spare.execute(f"USE {_SPARE}")
        except BaseException:
            database.close()
            raise
        _attached[key] = (database, 1)
        _spares[key] = spare
        return database.cursor()


_ATTACH = f"ATTACH '{{path}}' AS store (ROW_GROUP_SIZE {ROW_GROUP_SIZE})"


def invalidated(exc: BaseException) -> bool:
    """Whether DuckDB has invalidated the store's database with this error: a checkpoint failed (a full disk).

    Every statement fails from then on, until the file is detached and attached again (`Store.reattach`).
    """
    text = str(exc)
    return isinstance(exc, duckdb.FatalException) or (isinstance(exc, duckdb.Error) and ("invalidated" in text or "reattach" in text))


def disconnect(path: str, connection: Any, read_only: bool) -> None:
    """Close a store's connection; the last writer's of a file detaches it (and DuckDB checkpoints it)."""
    connection.close()
    if not attaches(path, read_only):
        return
    key = os.path.realpath(path)
    with _attached_lock:
        database, users = _attached[key]
        if users > 1:
            _attached[key] = (database, users - 1)
        else:
            del _attached[key]
            _spares.pop(key).close()
            database.close()


def connect(path: str, read_only: bool) -> Any:
    """`_connect`, with DuckDB's refusals as `StoreLocked` (another process holds the file) or `StoreError`."""
    try:
        return _connect(path, read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            pid = _holder_pid(str(exc))
            raise StoreLocked(path, pid, _command_of(pid) if pid is not None else None) from None
        raise StoreError(f"cannot open {path}: {exc}") from None
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {path}: {exc}") from None


def reattach(path: str, connection: Any) -> None:
    """Detach a writer's file and attach it again through its spare cursor (`Store.reattach` says when and why)."""
    if not attaches(path, False):
        raise StoreError("only a store open for writing can be attached again")
    with suppress(duckdb.Error):  # a result left open holds the old database: the file could not be attached again
        connection.complete()
    with _attached_lock:  # the other cursors' statements fail meanwhile, as they did before
        spare = _spares[os.path.realpath(path)]
        spare.execute("DETACH DATABASE IF EXISTS store")
        spare.execute(_ATTACH.format(path=path.replace("'", "''")))
        # detaching the default made `spare` the default for new cursors: detached and attached again, store is
        for statement in ("USE store", f"DETACH {_SPARE}", f"ATTACH ':memory:' AS {_SPARE}", f"USE {_SPARE}"):
            spare.execute(statement)
