"""Trial routing, for both proxies: which open attempt a request belongs to, and never a guess.

A proxy (`replay.proxy.ModelProxy`, `replay.mcp_proxy.McpProxy`) hands each attempt a ``Route``: its own random path
token (``/t/<token>/…``), so a straggler of an earlier attempt is never counted in a later one. A request on the bare
URL is placed by W3C ``baggage`` (``plumbline.trial.id`` and ``plumbline.trial.attempt``) or by a ``traceparent``
whose trace id is the attempt's; one that matches no open attempt is refused by the proxy and counted as unroutable.

``RoutingTable`` holds the open attempts under the proxy's lock: opening, closing and resolving are each one critical
section, so a request is either refused or placed on a route whose evidence has not been taken yet.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.loopback import parse_baggage
from plumbline_otel.runs import TRIAL_ATTEMPT, TRIAL_ID

if TYPE_CHECKING:
    from plumbline_otel.replay.contracts import Trial, TrialRoute


class Routed(Protocol):
    """A route's live account, as the table keeps it."""

    @property
    def trial(self) -> Trial: ...

    @property
    def token(self) -> str: ...

    closed: bool


S = TypeVar("S", bound=Routed)


@dataclass(frozen=True)
class Route(ABC):
    """One attempt's way into a proxy (`contracts.TrialRoute`); each proxy says which variables carry it (``env``): a
    route class that does not cannot be instantiated."""

    proxy_url: str
    token: str
    trial_id: str
    attempt: int

    @abstractmethod
    def env(self) -> dict[str, str]:
        """The variables an agent reads the route from; the proxy's own route class names them."""


def split_token(path: str) -> tuple[str | None, str]:
    """A request path as (route token or None, the path the agent meant): ``/t/<token>/v1/messages`` → (token, ``/v1/messages``)."""
    if not path.startswith("/t/"):
        return None, path
    token, _, rest = path[3:].partition("/")
    return token, "/" + rest


class RoutingTable(Generic[S]):
    """The open attempts of one proxy, by path token, by (trial id, attempt) and by trace id.

    ``what`` names the proxy in errors; ``lock`` is the proxy's own (its counters share it)."""

    def __init__(self, what: str, lock: threading.Lock) -> None:
        self.what, self.lock = what, lock
        self._by_token: dict[str, S] = {}
        self._by_attempt: dict[tuple[str, int], S] = {}
        self._by_trace: dict[str, S] = {}

    def open(self, state: S, opened: Callable[[S], None] | None = None) -> None:
        """Route ``state``'s attempt; ``opened(state)`` runs inside the same critical section. An attempt routes once."""
        identity = state.trial.identity
        with self.lock:
            if (identity.trial_id, identity.attempt) in self._by_attempt:
                raise ConfigError(f"trial {identity.trial_id} attempt {identity.attempt} already has an open {self.what} route")
            if opened is not None:
                opened(state)
            self._by_token[state.token] = state
            self._by_attempt[(identity.trial_id, identity.attempt)] = state
            self._by_trace[identity.trace_id] = state

    def close(self, route: TrialRoute, closed: Callable[[S], None] | None = None) -> S:
        """Stop routing the attempt (``state.closed``) and hand back its state; ``closed(state)`` runs inside."""
        if not isinstance(route, Route):  # the driver closes each route on the proxy that opened it
            raise ConfigError(f"not a plumbline proxy route: {route!r}")
        with self.lock:
            state = self._by_token.pop(route.token, None)
            if state is None:
                raise ConfigError(f"no open {self.what} route for trial {route.trial_id} attempt {route.attempt}")
            identity = state.trial.identity
            self._by_attempt.pop((identity.trial_id, identity.attempt), None)
            self._by_trace.pop(identity.trace_id, None)
            state.closed = True
            if closed is not None:
                closed(state)
        return state

    def resolve(self, token: str | None, baggage: str | Iterable[str] | None, traceparent: str | None,
                entered: Callable[[S], None] | None = None) -> tuple[S | None, str]:
        """The open attempt a request belongs to (``entered(state)`` inside the critical section), or None and why not:
        by path token, else baggage, else traceparent."""
        with self.lock:
            state, why = self._lookup(token, baggage, traceparent)
            if state is not None and entered is not None:
                entered(state)
            return state, why

    def _lookup(self, token: str | None, baggage: str | Iterable[str] | None, traceparent: str | None) -> tuple[S | None, str]:
        if token is not None:
            state = self._by_token.get(token)
            return (state, "") if state else (None, f"path token {token[:6]}… is not an open trial route")
        bag = parse_baggage(baggage)
        if TRIAL_ID in bag:
            try:
                key = (bag[TRIAL_ID], int(bag.get(TRIAL_ATTEMPT, "")))
            except ValueError:
                return None, f"baggage names trial {bag[TRIAL_ID]!r} without a numeric {TRIAL_ATTEMPT}"
            state = self._by_attempt.get(key)
            return (state, "") if state else (None, f"baggage names trial {key[0]!r} attempt {key[1]}, which is not open")
        parts = (traceparent or "").split("-")
        if len(parts) >= 2 and parts[1] in self._by_trace:
            return self._by_trace[parts[1]], ""
        return None, "no /t/<token> path prefix, no plumbline.trial.id baggage and no traceparent of an open trial"
