"""Shared fixtures; `tests/` is on sys.path so tests can import the `otlp` helpers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from demo_support import DemoRun, run_demo

from plumbline_otel.store import Store


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """`plumbline demo`, run once for every test that looks at what it produced (it takes most of a minute)."""
    return run_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real DuckDB file in a temporary directory."""
    with Store(tmp_path / "plumbline.duckdb") as s:
        yield s


# What enables a test that skipped, for skip reasons that do not name the command themselves (a reason
# that does names it between backticks, and that command is shown).
_ENABLE = (
    ("chromium", "apt-get install -y chromium"),
    ("postgresql", "apt-get install -y postgresql"),
    ("rotel", ".venv/bin/pip install rotel"),
    ("tmpfs", "run the tests as root (they mount a small tmpfs)"),
    ("nothing compiled", ".venv/bin/pip install -e .  (compiles the hot path with mypyc)"),
    ("jsonschema", ".venv/bin/pip install jsonschema"),
    ("node", "apt-get install -y nodejs npm"),
)


def _enabling_command(reason: str) -> str:
    named = re.findall(r"`([^`]+)`", reason)
    if named:
        return named[0]
    lowered = reason.lower()
    return next((command for key, command in _ENABLE if key in lowered), "(no command known: see the reason)")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """List every skipped test at the end of the run with the command that enables it (issue 42 item 5):
    a fresh machine without Chromium, PostgreSQL or a compiled build passes with tests left out, and
    must say which and how to run them."""
    skipped: dict[tuple[str, str], list[str]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        skipped.setdefault((reason, _enabling_command(reason)), []).append(report.nodeid)
    if not skipped:
        return
    terminalreporter.section(f"{sum(len(ids) for ids in skipped.values())} skipped test(s), and what enables them", sep="-")
    for (reason, command), ids in sorted(skipped.items(), key=lambda item: -len(item[1])):
        terminalreporter.write_line(f"{len(ids)} skipped: {reason}")
        terminalreporter.write_line(f"    enable: {command}")
        for nodeid in sorted(ids)[:5]:
            terminalreporter.write_line(f"    {nodeid}")
        if len(ids) > 5:
            terminalreporter.write_line(f"    ... and {len(ids) - 5} more")
