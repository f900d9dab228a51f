"""A progress line on stderr for a person watching a long command (`ingest`, `replay`, `certify`).

Only a terminal gets it: piped or redirected stderr (a CI log, a script) and `--quiet` see nothing
of it, and stdout is never touched, so a command's output and JSON stay clean. The line is redrawn
at most every `INTERVAL` seconds however often work advances (an ingest reports every request it
reads), nothing is drawn for a command done within `DELAY`, and it is erased when the command is
done. click's progress bar draws on every update, prints its label even to a pipe, and cannot put
a line above itself (replay's line per trial), hence this small one.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

INTERVAL = 0.25  # seconds between redraws
DELAY = 0.5  # seconds before the first draw: a quick command shows nothing
_CLEAR = "\r\x1b[K"


class Progress:
    """`label [#####     ] 40%  4.1/10.2 MB  12s, about 18s left`, on one line of a terminal's stderr.

    `advance` and `note` may be called from another thread than the one that made it (an ingest
    reads its input in a feeder thread).
    """

    def __init__(self, label: str, total: float | None = None, unit: str = "", quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.shown = not quiet and _is_terminal(self.stream)
        self.done = 0.0
        self.started = time.monotonic()
        self._drawn_at = 0.0
        self._drawn = False
        self._lock = threading.Lock()

    def advance(self, amount: float = 1) -> None:
        """Count `amount` more of the work done."""
        self.update(self.done + amount)

    def update(self, done: float, total: float | None = None) -> None:
        """Set how much of the work is done (and, when it became known or changed, of how much)."""
        with self._lock:
            self.done = done
            self.total = total if total is not None else self.total
            now = time.monotonic()
            if self.shown and now - self.started >= DELAY and now - self._drawn_at >= INTERVAL:
                self._draw(now)

    def stage(self, label: str) -> None:
        """Name what the command is doing now (a stage that advances nothing, drawn at once)."""
        with self._lock:
            self.label = label
            now = time.monotonic()
            if self.shown and now - self.started >= DELAY:
                self._draw(now)

    def note(self, line: str) -> None:
        """Print a line that stays (above the progress line on a terminal; as it is elsewhere, unless quiet)."""
        with self._lock:
            if self._drawn:
                self.stream.write(_CLEAR)
            self.stream.write(line + "\n")
            if self._drawn:
                self._draw(time.monotonic())
            self.stream.flush()

    def close(self) -> None:
        """Erase the progress line: what the command prints next starts on a clean line."""
        with self._lock:
            if self._drawn:
                self.stream.write(_CLEAR)
                self.stream.flush()
            self._drawn, self.shown = False, False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def line(self, width: int) -> str:
        """The progress line as drawn, cut to `width` columns."""
        elapsed = time.monotonic() - self.started
        parts = [self.label]
        if self.total:
            share = min(1.0, self.done / self.total)
            bar = 20
            parts.append(f"[{'#' * round(share * bar):<{bar}}] {share:4.0%}")
            parts.append(f"{_amount(self.done, self.unit)}/{_amount(self.total, self.unit)}")
        else:
            parts.append(_amount(self.done, self.unit))
        timing = _duration(elapsed)
        if self.total and 0 < self.done < self.total and elapsed >= 2:
            timing += f", about {_duration(elapsed * (self.total - self.done) / self.done)} left"
        parts.append(timing)
        return "  ".join(parts)[: max(0, width - 1)]

    def _draw(self, now: float) -> None:
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns  # the terminal drawn on, whatever stdout is
        except (AttributeError, ValueError, OSError):
            width = shutil.get_terminal_size((80, 24)).columns
        self.stream.write(_CLEAR + self.line(width))
        self.stream.flush()
        self._drawn, self._drawn_at = True, now


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _amount(value: float, unit: str) -> str:
    if unit == "B":
        for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    return f"{value:,.0f}{' ' + unit if unit else ''}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
