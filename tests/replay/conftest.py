"""Fixtures the replay tests share."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbline_otel.replay.proxy.simulated import SimulatedProvider

from .frameworks_support import NODE_AGENT, scripted_model
from .toy import SPEC, traffic_store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store of the toy agent's clean traffic on two tasks, and the toy spec (``spec.yaml``) beside it."""
    (tmp_path / "spec.yaml").write_text(SPEC)
    return traffic_store(tmp_path)


@pytest.fixture(scope="module")
def provider() -> Iterator[SimulatedProvider]:
    """The simulated model the framework agents reach through the proxy (`frameworks_support.scripted_model`), one per
    test module: a test counts the requests it made as a difference of ``requests``."""
    sim = SimulatedProvider(scripted_model).start()
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def node_agent_packages() -> Path:
    """The Node agent's one dependency (the openai npm package, at the version its package-lock.json pins),
    installed here by `npm ci` when missing or older than the lock file; npm's cache makes a second
    install offline. Skipped, saying how to enable it, only when Node or npm is not installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed: `apt-get install -y nodejs npm` enables the Node agent test")
    modules = NODE_AGENT / "node_modules"
    installed = modules / ".package-lock.json"  # npm writes it last: its presence means the install finished
    lock_path = Path(tempfile.gettempdir()) / f"plumbline-npm-{hashlib.sha256(bytes(NODE_AGENT)).hexdigest()[:16]}.lock"
    with open(lock_path, "w") as lock:  # test runs side by side (several virtualenvs, one checkout) install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed.exists() or installed.stat().st_mtime < (NODE_AGENT / "package-lock.json").stat().st_mtime:
            done = subprocess.run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=NODE_AGENT,
                                  capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"`npm ci` in {NODE_AGENT} failed:\n{done.stdout}\n{done.stderr}"
    assert (modules / "openai").is_dir(), f"`npm ci` in {NODE_AGENT} installed no openai package"
    return modules
