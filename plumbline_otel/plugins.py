"""Domains plug in here, so the product never imports one: a domain registers under an entry point.

A package declares, in its `pyproject.toml`::

    [project.entry-points."plumbline_otel.domains"]
    accounts_payable = "domains.accounts_payable.plugin:PLUGIN"

and `PLUGIN` is a `DomainPlugin`: its `plumbline domain run <name>` command and, optionally, the
study `plumbline demo` runs on it and the words of its trade the replay's equivalence guard reads
(`DomainLexicon`). A second domain plugs in the same way without editing the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the guard caches what it builds from one
class DomainLexicon:
    """The words of a domain's trade, for the replay's equivalence guard (`replay/guard.py`).

    The guard reads English (negation, modality, conditions, limits, dates, amounts, who does what
    to whom) and nothing of any trade; a domain tells it which words name its documents, ids,
    terms and parties, so that "the invoice" is a document and "inv 1029" an id. Every field is
    optional: a word the guard cannot place is an ordinary word, or a name where it is written as one.
    """

    name: str
    verbs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # verb class -> lemmas and phrases ("pay": ("remit",))
    documents: Mapping[str, str] = field(default_factory=dict)  # noun -> document kind ("bill" -> "invoice")
    plural_documents: Mapping[str, str] = field(default_factory=dict)  # plural noun -> document kind
    verb_nouns: Mapping[str, str] = field(default_factory=dict)  # a document noun where a verb stands -> verb class
    terms: Mapping[str, str] = field(default_factory=dict)  # word or phrase -> the term it names ("po" -> "purchase order")
    parties: frozenset[str] = frozenset()  # role nouns that can do or receive an action ("controller")
    counterparties: frozenset[str] = frozenset()  # nouns for the other side ("vendor"): "the vendor Acme" names Acme
    id_prefixes: tuple[str, ...] = ()  # prefixes of the domain's ids, so "inv 1029" is INV-1029
    transfers: frozenset[str] = frozenset()  # words that send money or a document somewhere ("remit", "charge")


@dataclass(frozen=True)
class DomainPlugin:
    """One domain: its name, its `plumbline domain run <name>` command, its demo study if it has one, and
    its lexicon for the equivalence guard if it has one."""

    name: str
    run_command: click.Command
    demo: DemoStudy | None = None
    lexicon: DomainLexicon | None = None


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


def installed_lexicons() -> tuple[DomainLexicon, ...]:
    """The lexicons of every installed domain, by domain name: what the guard reads when a caller names none."""
    return tuple(p.lexicon for _, p in sorted(domain_plugins().items()) if p.lexicon is not None)


__all__ = ["ENTRY_POINT_GROUP", "DemoStudy", "DomainLexicon", "DomainPlugin", "domain_plugin", "domain_plugins",
           "installed_lexicons"]
