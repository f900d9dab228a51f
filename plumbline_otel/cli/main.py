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


class _Commands(click.Group):
    """The subcommands, each imported when it is asked for: a command pays for its own imports only.

    Importing all sixteen took 0.5 s of CPU and 105 MB before any command ran (`plumbline ingest`
    imported the gRPC server and the report templates); one takes what it needs (`ingest`: 0.38 s, 88 MB).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ref = COMMANDS.get(cmd_name)
        if ref is None:
            return None
        module_name, attr = ref.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command


@click.group(cls=_Commands, context_settings={"auto_envvar_prefix": "PLUMBLINE", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="plumbline", message=f"%(prog)s, version %(version)s; hot path: {_native.BUILD}")
def cli() -> None:
    """Agent trajectories, coverage, invariants and certificates from OpenTelemetry traces."""


# Each subcommand's name and "module:attribute"; one module per subcommand.
COMMANDS = {
    "ingest": "plumbline_otel.cli.ingest:ingest",
    "trajectories": "plumbline_otel.cli.trajectories:trajectories",
    "coverage": "plumbline_otel.cli.coverage:coverage",
    "demo": "plumbline_otel.cli.demo:demo",
    "serve": "plumbline_otel.cli.serve:serve",
    "check": "plumbline_otel.cli.check:check",
    "certify": "plumbline_otel.cli.certify:certify",
    "gate": "plumbline_otel.cli.gate:gate",
    "plan": "plumbline_otel.cli.plan:plan",
    "compare": "plumbline_otel.cli.compare:compare",
    "domain": "plumbline_otel.cli.domain:domain",
    "replay": "plumbline_otel.cli.replay:replay",
    "proxy": "plumbline_otel.cli.proxy:proxy",
    "import": "plumbline_otel.cli.importer:import_group",
    "export": "plumbline_otel.cli.export:export",
    "report": "plumbline_otel.cli.report:report",
    "show": "plumbline_otel.cli.show:show",
    "lake": "plumbline_otel.cli.lake:lake",
}


def main() -> None:
    """Console-script entry point."""
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
