"""Domains plug in here, so the product never imports one: a domain registers under an entry point.

A package declares, in its `pyproject.toml`::

    [project.entry-points."plumbline_otel.domains"]
    accounts_payable = "domains.accounts_payable.plugin:PLUGIN"

and `PLUGIN` is a `DomainPlugin`: its `plumbline domain run <name>` command and, optionally, the
study `plumbline demo` runs on it. A second domain plugs in the same way without editing the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import click

from plumbline_otel.errors import ConfigError

ENTRY_POINT_GROUP = "plumbline_otel.domains"


class DemoStudy(Protocol):
    """What `plumbline demo` needs from a domain: baseline traffic, agents to replay, and the spec that judges them."""

    arms: tuple[str, ...]
    source_arm: str  # whose baseline runs stand for production traffic
    spec_path: Path

    def service(self, arm: str) -> str:
        """The service name the arm's spans carry."""
        ...

    def record_traffic(self, otlp_file: Path, study: str) -> None:
        """Run `source_arm` once on every task (simulated model, no faults) into an OTLP JSON-lines file."""
        ...

    def adapter(self, arm: str) -> Any:
        """A replay adapter (`plumbline_otel.replay.Adapter`) for the arm, on the simulated model."""
        ...


@dataclass(frozen=True)
class DomainPlugin:
    """One domain: its name, its `plumbline domain run <name>` command, and its demo study if it has one."""

    name: str
    run_command: click.Command
    demo: DemoStudy | None = None


def domain_plugins() -> dict[str, DomainPlugin]:
    """Every installed domain by name; a plugin that fails to load is a `ConfigError` naming its entry point."""
    found: dict[str, DomainPlugin] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = point.load()
        except Exception as exc:
            raise ConfigError(f"domain plugin {point.name} ({point.value}): cannot load: {type(exc).__name__}: {exc}") from exc
        if not isinstance(plugin, DomainPlugin) or plugin.name != point.name:
            raise ConfigError(f"domain plugin {point.name} ({point.value}): expected a DomainPlugin named {point.name!r}")
        found[point.name] = plugin
    return found


def domain_plugin(name: str) -> DomainPlugin:
    """The installed domain `name`; a `ConfigError` listing what is installed otherwise."""
    plugins = domain_plugins()
    if name not in plugins:
        installed = ", ".join(sorted(plugins)) or "none (is the package installed with `pip install -e .`?)"
        raise ConfigError(f"no domain {name!r} is installed; installed domains: {installed}")
    return plugins[name]


__all__ = ["ENTRY_POINT_GROUP", "DemoStudy", "DomainPlugin", "domain_plugin", "domain_plugins"]
