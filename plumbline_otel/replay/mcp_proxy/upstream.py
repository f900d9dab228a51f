"""The MCP proxy's one connection to the tool server, relaunched when the server dies.

A stdio server is a child process of the proxy: when it crashes (a tool that calls ``os._exit``,
an out-of-memory kill), every later call of every later trial would fail with "Connection
closed", and each would be scored against an agent that did nothing wrong. ``Upstream`` watches
the connection (a closed session is noticed within ``POLL_S`` even with no call in flight) and
relaunches the server (a Streamable HTTP URL: reconnects) with back-off, at most
``max_relaunches`` times in a row without a successful call in between; past that it gives up
and says so on every call. The call during which the server died is never sent again (the tool
may have acted); a call that found the server already dead never reached it, so it waits for the
relaunch and goes to the new server.

The client context lives in one task (``run``), as anyio's task groups require; handlers on the
same loop reach the current client through ``client()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from mcp.client.client import Client

POLL_S = 0.2  # how often a connection with no call in flight is checked for a dead server
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0


class UpstreamGone(Exception):
    """The tool server is dead and was not (or not yet) relaunched within the wait."""


def session_closed(client: Client) -> bool:
    """Whether the client's session has seen its transport end (the server process died, or the link broke).

    Read from the SDK's dispatcher (``_closed``); an SDK without it reads as open, and a dead
    server is then noticed by the next call's "Connection closed" instead.
    """
    try:
        dispatcher = getattr(client.session, "_dispatcher", None)
    except Exception:  # noqa: BLE001 - not connected yet, or the SDK changed: treat as open
        return False
    return bool(getattr(dispatcher, "_closed", False))


@dataclass
class Relaunch:
    """One relaunch: when, why, and whether the new server came up."""

    at: float
    reason: str
    ok: bool = False
    error: str | None = None


class RelaunchDoc(TypedDict):
    """One relaunch as the proxy's evidence and ``McpProxy.relaunches`` show it."""

    at: float
    reason: str
    ok: bool
    error: NotRequired[str]


@dataclass
class Upstream:
    """The supervised connection (see the module docstring)."""

    make_client: Callable[[], Client]
    describe: Callable[[BaseException], str]
    max_relaunches: int = 5
    relaunches: list[Relaunch] = field(default_factory=list)
    gave_up: str | None = None
    generation: int = 0
    _client: Client | None = None
    _dead_reason: str | None = None
    _failures_in_a_row: int = 0
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _dead: asyncio.Event = field(default_factory=asyncio.Event)
    _first: asyncio.Future[Client] | None = None

    async def run(self) -> None:
        """Hold the connection; on its death, relaunch with back-off until ``max_relaunches`` in a row have failed."""
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        while True:
            try:
                async with self.make_client() as client:
                    self._client, self._dead_reason = client, None
                    self.generation += 1
                    self._dead.clear()
                    self._ready.set()
                    if not self._first.done():
                        self._first.set_result(client)
                    elif self.relaunches:
                        self.relaunches[-1].ok = True
                    while not self._dead.is_set() and not session_closed(client):
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._dead.wait(), POLL_S)
                    self._ready.clear()
                    self._client = None
                    reason = self._dead_reason or "the server's connection closed (the process exited)"
            except Exception as exc:  # noqa: BLE001 - a launch or a connection that failed: reported, then relaunched
                self._ready.clear()
                self._client = None
                if not self._first.done():
                    self._first.set_exception(exc)  # the first launch: start() reports it, nothing is relaunched
                    return
                reason = f"relaunch failed: {self.describe(exc)}"
                if self.relaunches:
                    self.relaunches[-1].error = self.describe(exc)
            self._failures_in_a_row += 1
            if self._failures_in_a_row > self.max_relaunches:
                self.gave_up = (f"the tool server died {self._failures_in_a_row} times with no successful call in between; "
                                f"not relaunched again (last: {reason})")
                self._ready.set()  # waiters see gave_up
                return
            await asyncio.sleep(min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self._failures_in_a_row - 1)))
            self.relaunches.append(Relaunch(time.time(), reason))

    async def first_client(self) -> Client:
        """The first connection, or the exception that kept it from being made."""
        while self._first is None:
            await asyncio.sleep(0)
        return await self._first

    def current(self) -> tuple[Client | None, int]:
        """The live client (None while relaunching) and its generation."""
        client = self._client
        if client is not None and session_closed(client):
            self.died(self.generation, "the server's connection closed (the process exited)")
            return None, self.generation
        return client, self.generation

    async def client(self, wait_s: float) -> tuple[Client, int]:
        """A live client, waiting up to ``wait_s`` for a relaunch; ``UpstreamGone`` if there is none."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.gave_up is not None:
                raise UpstreamGone(self.gave_up)
            client, generation = self.current()
            if client is not None:
                return client, generation
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamGone(f"the tool server is down and was not back within {wait_s:g}s"
                                   + (f" ({self.relaunches[-1].error})" if self.relaunches and self.relaunches[-1].error else ""))
            self._ready.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), min(left, POLL_S))

    def died(self, generation: int, reason: str) -> None:
        """A call saw the connection of ``generation`` end: relaunch (once per generation)."""
        if generation == self.generation and not self._dead.is_set():
            self._dead_reason = reason
            self._dead.set()

    def succeeded(self) -> None:
        """A call went through: the count of deaths in a row starts again."""
        self._failures_in_a_row = 0

    def snapshot(self) -> list[RelaunchDoc]:
        """Every relaunch so far, as JSON."""
        out: list[RelaunchDoc] = []
        for r in self.relaunches:
            doc: RelaunchDoc = {"at": r.at, "reason": r.reason, "ok": r.ok}
            if r.error:
                doc["error"] = r.error
            out.append(doc)
        return out
