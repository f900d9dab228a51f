"""One runner per study: an exclusive ``flock`` on ``<state_dir>/study.lock``.

The kernel drops a ``flock`` when its process dies, however it dies, so a crashed runner never
leaves a study locked (a pid file alone would need a liveness guess). The file keeps the pid and
start time of the holder only to name it in the refusal. Without the lock two ``--resume``
processes both read "nothing done" and both ran every trial.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from plumbline_otel.errors import ReplayError


class StudyLocked(ReplayError):
    """Another process is running this study."""


class StudyLock:
    """Held for the whole of ``Study.run``; ``acquire`` refuses at once rather than wait."""

    def __init__(self, state_dir: str | Path, study: str) -> None:
        self.path = Path(state_dir) / "study.lock"
        self.study = study
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise StudyLocked(f"study {self.study!r} is being run by {holder} ({self.path}); "
                              "wait for it to finish, then --resume") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
