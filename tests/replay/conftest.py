"""Fixtures the replay tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from .toy import SPEC, traffic_store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store of the toy agent's clean traffic on two tasks, and the toy spec (``spec.yaml``) beside it."""
    (tmp_path / "spec.yaml").write_text(SPEC)
    return traffic_store(tmp_path)
