"""`plumbline domain run <name>`: each installed domain's own run command (`plumbline_otel/plugins.py`)."""

from __future__ import annotations

import click

from plumbline_otel.plugins import domain_plugins


class _Domains(click.Group):
    """The installed domains, looked up when the command line names one (a broken plugin fails only then)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(domain_plugins())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        plugin = domain_plugins().get(cmd_name)
        return plugin.run_command if plugin else None


@click.group()
def domain() -> None:
    """Reference domains: run their agent arms end to end and grade them."""


@domain.group("run", cls=_Domains)
def run() -> None:
    """Run an installed domain's agent end to end, traced and graded: `plumbline domain run NAME --help`."""
