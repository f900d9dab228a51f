"""The command line: every subcommand is listed, and each imports only what it needs."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import COMMANDS, cli

# Run in a fresh interpreter: what a command imported is only visible before anything else did.
IMPORTS = r"""
import sys
from plumbline_otel.cli.main import main
sys.argv = ["plumbline", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(" ".join(m for m in ("grpc", "jinja2", "scipy", "anthropic", "duckdb") if m in sys.modules), file=sys.stderr)
"""


def _imported(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", IMPORTS, *args], capture_output=True, text=True, timeout=EVENT_DEADLINE_S, check=True)
    return set(done.stderr.split())


def test_help_lists_every_subcommand_with_its_summary() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)
    for name in COMMANDS:
        assert cli.get_command(None, name).name == name  # type: ignore[arg-type,union-attr]


def test_a_command_imports_only_what_it_needs() -> None:
    assert _imported("--version") == set()  # nothing of the product's stack to print a version
    assert _imported("ingest", "--help") == {"duckdb"}  # not the gRPC server, nor the report's templates
    assert {"grpc", "duckdb"} <= _imported("serve", "--help")
