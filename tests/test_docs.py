"""The front door holds: every link in the README, CONTRIBUTING.md and docs/ resolves, every repository
path they name exists, and every `plumbline` command they show exists with the options it is shown with."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from plumbline_otel.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
REPO_PATH = re.compile(r"^(?:plumbline_otel|tests|bench|configs|domains|runs|proto)/[\w./*-]*$")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{_page_id(page)}: link to {target} does not resolve"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_repository_path_named_exists(page: Path) -> None:
    for span in CODE_SPAN.findall(page.read_text(encoding="utf-8")):
        span = span.strip()
        if not REPO_PATH.match(span) or "<" in span:
            continue
        if "*" in span:
            assert list(ROOT.glob(span)), f"{_page_id(page)}: `{span}` matches nothing"
        else:
            assert (ROOT / span.rstrip("/")).exists(), f"{_page_id(page)}: `{span}` does not exist"


def _commands(text: str) -> list[list[str]]:
    """Every `plumbline …` invocation shown: in fenced blocks (continued lines joined) and in code spans."""
    shown: list[str] = []
    for block in FENCE.findall(text):
        shown += [line.split("#", 1)[0] for line in block.replace("\\\n", " ").splitlines()]
    shown += CODE_SPAN.findall(text)
    out = []
    for line in shown:
        line = line.replace("\\|", "\x00")  # an escaped pipe in a table cell: alternatives, not a column
        for match in re.finditer(r"(?:^|\s|/)plumbline\s+([a-z][\w-]*(?:[^|`]*))", line):
            try:
                words = shlex.split(match.group(1).replace("…", ""))
            except ValueError:
                words = match.group(1).split()
            out.append([w.replace("\x00", "|") for w in words])
    return out


@cache
def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, f"plumbline {' '.join(path)} --help: {result.output}"
    return result.output


def _resolve(words: list[str]) -> tuple[str, ...]:
    """The command path the words name: a command, or a group and its subcommand."""
    path: list[str] = []
    group: click.Group = cli
    for word in words:
        if word.startswith("-"):
            break
        command = group.get_command(click.Context(group), word)
        if command is None:
            break
        path.append(word)
        if not isinstance(command, click.Group):
            break
        group = command
    return tuple(path)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_shown_exists_with_its_options(page: Path) -> None:
    shown = _commands(page.read_text(encoding="utf-8"))
    for alternatives in shown:  # `plumbline trajectories|coverage|check --server …` shows several commands at once
        for name in alternatives[0].split("|") if alternatives else []:
            _check(page, [name, *alternatives[1:]] if "|" in alternatives[0] else alternatives)


def _check(page: Path, words: list[str]) -> None:
    path = _resolve(words)
    assert path, f"{_page_id(page)}: `plumbline {' '.join(words)}` names no command"
    helptext = _help(path)
    for word in words:
        option = word.split("=", 1)[0].rstrip(",.;:)")
        if re.fullmatch(r"--[a-z][\w-]*", option):
            assert option in helptext, f"{_page_id(page)}: `plumbline {' '.join(path)}` has no option {option}"
