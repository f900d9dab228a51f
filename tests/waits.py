"""How long a test waits for an event, and a wait that returns as soon as it happens (issue 42 item 5).

A test waits for an event (an answer, a metric, a row, a line on a pipe, a process's exit), never for a time.
The deadline only bounds a hang: on a loaded 2-core machine importing the package alone took 20 s (load 17-25),
so a deadline far beyond any slow machine's pace costs a fast machine nothing (the wait ends with the event) and
keeps a slow one from failing for its speed alone. A bound that is itself what a test checks (a deadline the
product enforces) is not one of these: it stays in its test, far from both the value checked and the timeout it
is told apart from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

EVENT_DEADLINE_S = 300.0  # seconds: how long a test waits for an event before it calls the wait a hang

T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, deadline_s: float = EVENT_DEADLINE_S, every_s: float = 0.1) -> T:
    """Poll `condition` until it returns something truthy (returned), failing after `deadline_s` with `what`."""
    deadline = time.monotonic() + deadline_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {deadline_s:g} s for {what}")
        time.sleep(every_s)
    return value
