"""A throwaway PostgreSQL server for the lake's catalog and a replay study's shared state.

Debian's `postgresql` package (`.ci/run` installs it) puts `initdb` and `pg_ctl` under
/usr/lib/postgresql/<version>/bin. The server gets a fresh cluster in a temporary folder, listens on
127.0.0.1 only, trusts local connections, and is stopped after the session. As root, the cluster
is made and run by the `postgres` user (the server refuses to run as root). Without the package
the tests that need it are skipped, except in CI, where they fail.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.store import Store

PG_CTL_WAIT_S = str(int(EVENT_DEADLINE_S))  # pg_ctl -t: how long -w may wait for the server to start or stop


def _pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """postgresql://postgres@127.0.0.1:PORT/postgres of a server started for the session."""
    binaries = _pg_bin()
    if binaries is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed: .ci/run installs Debian's postgresql package")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): the Postgres catalog and study-state tests need it")
    root = Path(tempfile.mkdtemp(prefix="plumbline-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        root.chmod(0o755)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, stdout=subprocess.DEVNULL)
    options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=50"
    # -w waits for the server to accept connections (the event); -t bounds only a hang (pg_ctl's own default, 60 s,
    # is within reach of a start on a loaded machine)
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "-t", PG_CTL_WAIT_S, "start"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", PG_CTL_WAIT_S, "stop"],
                       check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_db(postgres_url: str) -> Iterator[str]:
    """A fresh database on the session's server (one per test)."""
    import psycopg

    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    yield postgres_url.rsplit("/", 1)[0] + f"/{name}"


def _count() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n


_counter = _count()


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, Store]]:
    """Two instances' stores, ``a`` and ``b`` (``tmp_path/<name>.duckdb``), closed after the test: the lake commit tests
    fill them (`lake_support.add_runs`) and sync each as its instance, round after round."""
    opened = {name: Store(tmp_path / f"{name}.duckdb") for name in ("a", "b")}
    try:
        yield opened
    finally:
        for store in opened.values():
            store.close()
