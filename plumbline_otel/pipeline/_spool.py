"""The spool: where workers leave their parts' Arrow tables for the writer, as files in memory it maps without copying."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from plumbline_otel.pipeline._parts import Part, SpanPart, TrajectoryPart

_SPOOL_PREFIX = "plumbline-parts-"


class Spool:
    """Where workers leave their parts' Arrow tables for the writer: files in memory, mapped, never copied.

    Pickled down the queue's pipe, a table was copied four times (pickled, written, read in 64 KiB
    pieces, unpickled): 10 µs of CPU a span across the workers and the writer, a tenth of a
    2-worker ingest. Written as an Arrow IPC file to `/dev/shm` it is copied once, and the writer's
    DuckDB reads the mapped buffers in place. The writer unlinks each file as it maps it (the pages
    live until the table is dropped), and removes the directory when the pool closes; workers remove
    it when they find their writer gone (killed), and a new pool removes those of writers that died.
    A table the spool has no room for goes down the pipe as before.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._written = 0

    @staticmethod
    def base() -> str:
        """The spool's parent: `/dev/shm` (memory) where there is one, else the temporary directory."""
        return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()

    @classmethod
    def create(cls) -> Spool:
        """A new spool directory named for this process, after removing those of writers that died."""
        base = cls.base()
        for name in os.listdir(base):
            if name.startswith(_SPOOL_PREFIX) and not _alive(name[len(_SPOOL_PREFIX):].split("-")[0]):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        return cls(tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=base))

    def ship(self, part: Part, shard: int) -> tuple[Part, str | None]:
        """`part` without its table, and the file holding the table (None: the part goes whole)."""
        if not isinstance(part, SpanPart | TrajectoryPart) or part.table is None:
            return part, None
        table = part.table
        self._written += 1
        path = os.path.join(self.path, f"{shard}-{self._written}.arrow")
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        except OSError:  # no room (a container's small /dev/shm), or the directory is gone
            with contextlib.suppress(OSError):
                os.unlink(path)
            return part, None
        return replace(part, table=None), path

    @staticmethod
    def land(message: tuple[Any, str | None]) -> Any:
        """The part a worker shipped, its table mapped from the spool (and the file unlinked)."""
        part, path = message
        if path is None:
            return part
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        os.unlink(path)
        return replace(part, table=table)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Whether a process `pid` (text from a spool's name) exists; what is not a pid counts as alive."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def spools(pid: int) -> list[str]:
    """The spool directories of the writer process `pid`."""
    base = Spool.base()
    return [os.path.join(base, name) for name in os.listdir(base) if name.startswith(f"{_SPOOL_PREFIX}{pid}-")]


def spooled_bytes(pid: int) -> int:
    """Bytes the spools of the writer `pid` hold now: parts made and not yet mapped (for memory figures)."""
    total = 0
    for path in spools(pid):
        with contextlib.suppress(OSError):  # a part mapped, or the spool removed, while counting
            total += sum(entry.stat().st_size for entry in os.scandir(path))
    return total
