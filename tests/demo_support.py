"""`plumbline demo` run once per test session (the `demo_run` fixture): the demo and page tests read what it wrote."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner, Result


@dataclass(frozen=True)
class DemoRun:
    """One run of `plumbline demo` on its embedded default: what it printed and wrote."""

    result: Result
    db: Path
    runs: Path

    @property
    def certificate(self) -> Path:
        return self.runs / "certificate.json"

    @property
    def report(self) -> Path:
        return self.runs / "report.html"


def run_demo(root: Path) -> DemoRun:
    """The README's first command, on its embedded default, in `root`."""
    from plumbline_otel.cli.main import cli

    result = CliRunner().invoke(cli, ["demo", "--db", str(root / "d.duckdb"), "--runs-dir", str(root / "runs")])
    return DemoRun(result, root / "d.duckdb", root / "runs")
