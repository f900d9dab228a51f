"""The members a subclass must write (an adapter's ``run``, a proxy route's ``env``) are abstract: a class that leaves
one out fails where it is instantiated, naming the member, and not at its first trial or first routed agent."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest

from domains.accounts_payable.replay_adapter import APAdapter
from plumbline_otel.replay.adapters import CommandAdapter, HttpAdapter, IsolatedAdapter, PythonAdapter
from plumbline_otel.replay.contracts import AdapterBase, DeclaredAdapter, Trial, TrialOutcome
from plumbline_otel.replay.mcp_proxy.server import McpRoute
from plumbline_otel.replay.proxy.server import ProxyRoute
from plumbline_otel.replay.routing import Route


def _subclasses(base: type) -> set[type]:
    """Every class below ``base`` that is imported, but for the deliberately incomplete ones this file defines."""
    found: set[type] = set()
    subclasses: list[type] = base.__subclasses__()
    for sub in subclasses:
        found |= ({sub} if sub.__module__ != __name__ else set()) | _subclasses(sub)
    return found


def test_an_adapter_without_run_cannot_be_instantiated() -> None:
    class Describes(AdapterBase):
        def describe(self) -> str | None:
            return "an agent with no way to run it"

    with pytest.raises(TypeError, match=r"abstract method '?run'?"):
        Describes()  # type: ignore[abstract]


def test_an_adapter_with_run_instantiates_with_the_defaults() -> None:
    class Runs(AdapterBase):
        def run(self, trial: Trial) -> TrialOutcome:
            return TrialOutcome(output=trial.text)

    adapter = Runs()
    assert (adapter.describe(), adapter.cancel(), adapter.grace_s) == (None, 0, AdapterBase.grace_s)


def test_a_route_without_env_cannot_be_instantiated() -> None:
    @dataclass(frozen=True)
    class Unnamed(Route):
        pass

    with pytest.raises(TypeError, match=r"abstract method '?env'?"):
        Unnamed("http://127.0.0.1:1", "token", "trial", 0)  # type: ignore[abstract]


def test_every_route_class_writes_env() -> None:
    route = ProxyRoute("http://127.0.0.1:1", "tok", "trial", 0)
    assert route.env()["OPENAI_BASE_URL"] == "http://127.0.0.1:1/t/tok/v1"
    assert McpRoute("http://127.0.0.1:1", "tok", "trial", 0).env() != {}
    assert {cls for cls in _subclasses(Route) if inspect.isabstract(cls)} == set()
    assert {ProxyRoute, McpRoute} <= _subclasses(Route)


def test_every_adapter_class_writes_run() -> None:
    """The package's adapters and the accounts-payable domain's (imported above) are all concrete, and so is any other
    imported subclass (another test module's, when they run in one process)."""
    named = {PythonAdapter, IsolatedAdapter, CommandAdapter, HttpAdapter, DeclaredAdapter, APAdapter}
    assert named <= _subclasses(AdapterBase)
    assert {cls for cls in _subclasses(AdapterBase) if inspect.isabstract(cls)} == set()
