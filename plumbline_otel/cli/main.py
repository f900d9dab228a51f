"""`plumbline` root command: registers the subcommands and turns PlumblineError into a message.

Exit codes: 0 success, 1 a PlumblineError (message, no traceback), 2 usage error, 130 Ctrl-C.
Subcommands may use other codes for their own verdicts (ingest 3, gate 1/2) as documented.
"""

from __future__ import annotations

import importlib
import sys

import click

from plumbline_otel import __version__, _native
from plumbline_otel.errors import PlumblineError


@click.group(context_settings={"auto_envvar_prefix": "PLUMBLINE", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="plumbline", message=f"%(prog)s, version %(version)s; hot path: {_native.BUILD}")
def cli() -> None:
    """Agent trajectories, coverage, invariants and certificates from OpenTelemetry traces."""


# "module:attribute" of each subcommand; one module per subcommand, imported when registered.
COMMANDS = [
    "plumbline_otel.cli.ingest:ingest",
    "plumbline_otel.cli.trajectories:trajectories",
    "plumbline_otel.cli.coverage:coverage",
    "plumbline_otel.cli.demo:demo",
    "plumbline_otel.cli.serve:serve",
    "plumbline_otel.cli.check:check",
    "plumbline_otel.cli.certify:certify",
    "plumbline_otel.cli.gate:gate",
    "plumbline_otel.cli.plan:plan",
    "plumbline_otel.cli.compare:compare",
    "plumbline_otel.cli.domain:domain",
    "plumbline_otel.cli.replay:replay",
    "plumbline_otel.cli.importer:import_group",
    "plumbline_otel.cli.export:export",
    "plumbline_otel.cli.report:report",
    "plumbline_otel.cli.show:show",
]


def _register() -> None:
    for ref in COMMANDS:
        module_name, attr = ref.split(":")
        cli.add_command(getattr(importlib.import_module(module_name), attr))


def main() -> None:
    """Console-script entry point."""
    _register()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except PlumblineError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
