"""A replay study's state in PostgreSQL, so runners on several machines share one study (`--state-url postgresql://…`).

The file-based state (`ledger.Ledger`, `budget.SpendCap` with a journal, `lock.StudyLock`) stays the
embedded default; this is the same state behind the same interfaces, in three tables any number of
runners share:

    plumbline_study_rows     the ledger's rows and the spend account's rows, in commit order
                             (`seq`), per study; each kind appended under its own advisory lock
    plumbline_study_claims   one row per planned trial: which runner holds it, until when (its
                             lease), and whether it is decided
    plumbline_study_runners  each runner's lease, renewed by a heartbeat while it runs

`PgSpendCap` is `SpendCap` with its journal in Postgres: every operation takes the study's
spend lock (`pg_advisory_xact_lock`) in a transaction, applies the rows other runners appended
since it last looked, decides, and appends its own row, so the cap is exact across all runners
(no runner ever sees an account another is changing). `PgLedger` is `Ledger` with its rows there.
`StudyClaims` hands out trials: `claim_next` takes the first free trial with `SELECT … FOR UPDATE
SKIP LOCKED` (two runners never take one trial; neither waits for the other), and a trial whose
runner stopped renewing its lease (killed, machine lost) is free again once the lease expires;
`PgSpendCap.release_dead` releases that runner's open reservations at what they metered.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.budget import Reservation, SpendCap
from plumbline_otel.replay.ledger import Ledger
from plumbline_otel.trials import KeyRing

_HOST = socket.gethostname()
_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS plumbline_study_rows (
        seq BIGSERIAL PRIMARY KEY, study TEXT NOT NULL, kind TEXT NOT NULL, row JSONB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS plumbline_study_rows_by_study ON plumbline_study_rows (study, kind, seq)",
    """CREATE TABLE IF NOT EXISTS plumbline_study_claims (
        study TEXT NOT NULL, trial_id TEXT NOT NULL, ord INTEGER NOT NULL DEFAULT 0, runner TEXT,
        lease_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity', decided BOOLEAN NOT NULL DEFAULT false,
        PRIMARY KEY (study, trial_id))""",
    """CREATE TABLE IF NOT EXISTS plumbline_study_runners (
        study TEXT NOT NULL, runner TEXT NOT NULL, host TEXT, pid INTEGER, lease_until TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (study, runner))""",
]


def connect(url: str) -> Any:
    """A psycopg connection to the study state, its tables made on first use (by whichever runner comes first)."""
    import psycopg

    try:
        connection = psycopg.connect(url, autocommit=False)
    except psycopg.Error as exc:
        raise ReplayError(f"--state-url: cannot connect: {str(exc).strip()}") from None
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(hashtext('plumbline_study_schema'))")
        for statement in _SCHEMA:
            connection.execute(statement)
    return connection


class _Rows:
    """One study's rows of one kind: appended and read in commit order under the kind's advisory lock."""

    def __init__(self, url: str, study: str, kind: str) -> None:
        self.connection = connect(url)
        self.study, self.kind = study, kind
        self.seq = 0
        self.lock = threading.RLock()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """A transaction holding the study's lock of this kind: rows appended inside it commit together."""
        with self.lock, self.connection.transaction():
            self.connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"{self.study}:{self.kind}"])
            yield

    def since(self) -> list[dict[str, Any]]:
        """Rows appended since the last call (call it under `locked`: seq order is commit order then)."""
        found = self.connection.execute("SELECT seq, row FROM plumbline_study_rows WHERE study = %s AND kind = %s AND seq > %s "
                                        "ORDER BY seq", [self.study, self.kind, self.seq]).fetchall()
        if found:
            self.seq = int(found[-1][0])
        return [row for _, row in found]

    def append(self, row: dict[str, Any]) -> None:
        """Append a row (under `locked`, after `since`: every earlier row has been read, so ours is not read back)."""
        found = self.connection.execute("INSERT INTO plumbline_study_rows (study, kind, row) VALUES (%s, %s, %s::jsonb) RETURNING seq",
                                        [self.study, self.kind, orjson.dumps(row, default=str).decode()]).fetchone()
        self.seq = int(found[0])


def shared_state(url: str, study: str, make: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The shared study's one instance id and secret key (`trials.KeyRing`): the first runner makes them, every
    other runner and `certify --state-url` reads the same, so records of every runner verify under one key."""
    rows = _Rows(url, study, "state")
    try:
        with rows.locked():
            found = rows.since()
            if found:
                return dict(found[0])
            made = make()
            rows.append(made)
            return made
    finally:
        rows.connection.close()


def shared_keys(url: str) -> KeyRing:
    """Every shared study's key (`shared_state`), for certify."""
    connection = connect(url)
    try:
        found = connection.execute("SELECT row FROM plumbline_study_rows WHERE kind = 'state'").fetchall()
    finally:
        connection.close()
    return KeyRing({str(r["instance"]): str(r["key"]) for (r,) in found if isinstance(r, dict) and "key" in r}, (url,))


class PgSpendCap(SpendCap):
    """`SpendCap` whose account is the study's spend rows in Postgres: exact across every runner sharing them."""

    def __init__(self, url: str, study: str, limit_usd: float | None = None, runner: str | None = None) -> None:
        self._rows = _Rows(url, study, "spend")
        self.runner = runner or f"{_HOST}:{os.getpid()}"
        super().__init__(limit_usd)  # reads what earlier runs settled (`_locked`)
        with self._locked():
            pass
        self.prior = self._settled

    class _PgHeld:
        def __init__(self, cap: PgSpendCap) -> None:
            self.cap = cap
            self._inner: Any = None

        def __enter__(self) -> None:
            self.cap._lock.acquire()
            try:
                self._inner = self.cap._rows.locked()
                self._inner.__enter__()
                for row in self.cap._rows.since():
                    if "spend" in row:
                        self.cap._apply(row)
            except BaseException:
                self.cap._lock.release()
                raise

        def __exit__(self, *exc: Any) -> None:
            try:
                self._inner.__exit__(*exc)
            finally:
                self.cap._lock.release()

    def _locked(self) -> Any:  # SpendCap._Held's Postgres twin
        return PgSpendCap._PgHeld(self)

    def _record(self, row: dict[str, object]) -> None:
        row = {**row, "runner": self.runner}
        self._apply(row)
        self._rows.append(row)
        self._high_water = max(self._high_water, self._settled + sum(self._open.values()))

    def release_dead(self, pids: Iterable[int] | None = None, *, host: str | None = None) -> list[Reservation]:
        """Settle the open reservations of runners whose lease expired (any machine), at what their calls metered."""
        released: list[Reservation] = []
        with self._locked():
            expired = {r for (r,) in self._rows.connection.execute(
                "SELECT runner FROM plumbline_study_runners WHERE study = %s AND lease_until < now()", [self._rows.study]).fetchall()}
            owners = self._runner_of
            for rid, usd in list(self._open.items()):
                runner = owners.get(rid)
                if runner is None or runner == self.runner or runner not in expired:
                    continue
                metered = rid in self._used
                actual = self._used[rid] if metered else usd
                pid, owner_host = self._owner.get(rid, (None, None))
                released.append(Reservation(rid, usd, actual, metered, pid, owner_host))
                self._record({"spend": "settle", "id": rid, "usd": actual, "released_runner": runner})
        if released:
            self._wake()
        return released

    @property
    def _runner_of(self) -> dict[str, str]:
        found = self._rows.connection.execute(
            "SELECT row->>'id', row->>'runner' FROM plumbline_study_rows WHERE study = %s AND kind = 'spend' AND row->>'spend' = 'reserve'",
            [self._rows.study]).fetchall()
        return {rid: runner for rid, runner in found if runner}


class PgLedger(Ledger):
    """`Ledger` whose rows are the study's ledger rows in Postgres (attempt numbers are never reused across runners)."""

    def __init__(self, url: str, study: str) -> None:
        self._rows = _Rows(url, study, "ledger")
        super().__init__(f"postgres:{study}")

    def reload(self) -> None:
        with self._rows.locked():
            self._rows.seq = 0
            self.rows = self._rows.since()

    def begin_attempt(self, trial_id: str) -> int:
        with self._lock, self._rows.locked():
            self.rows.extend(self._rows.since())
            attempt = 1 + max((int(r.get("attempt") or 0) for r in self.rows if r.get("trial_id") == trial_id), default=0)
            row = {"trial_id": trial_id, "attempt": attempt, "status": "started", "pid": os.getpid(), "host": _HOST}
            self._rows.append(row)
            self.rows.append(row)
            return attempt

    def append(self, row: dict[str, Any]) -> None:
        row = orjson.loads(orjson.dumps(row, default=str))
        with self._lock, self._rows.locked():
            self.rows.extend(self._rows.since())
            self._rows.append(row)
            self.rows.append(row)


class StudyClaims:
    """Which runner holds which trial: claimed with row locks, held by a lease its heartbeat renews."""

    def __init__(self, url: str, study: str, runner: str | None = None, lease_s: float = 30.0) -> None:
        self.connection = connect(url)
        self.study, self.lease_s = study, lease_s
        self.runner = runner or f"{_HOST}:{os.getpid()}"  # as PgSpendCap names it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.renew()

    def _tx(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._lock, self.connection.transaction():
            cursor = self.connection.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def plan(self, trial_ids: Sequence[str]) -> None:
        """Add the study's planned trials (those already there keep their state)."""
        with self._lock, self.connection.transaction(), self.connection.cursor() as cursor:
            cursor.executemany("INSERT INTO plumbline_study_claims (study, trial_id, ord) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                               [(self.study, t, i) for i, t in enumerate(trial_ids)])

    def claim_next(self) -> str | None:
        """The first trial no live runner holds and none decided, now this runner's; None when there is none."""
        found = self._tx(
            "UPDATE plumbline_study_claims c SET runner = %s, lease_until = now() + make_interval(secs => %s) "
            "WHERE (c.study, c.trial_id) = (SELECT study, trial_id FROM plumbline_study_claims WHERE study = %s AND NOT decided "
            "AND lease_until < now() ORDER BY ord, trial_id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING c.trial_id",
            [self.runner, self.lease_s, self.study])
        return str(found[0][0]) if found else None

    def claim(self, trial_id: str) -> bool:
        """Take this trial if no live runner holds it and it is not decided."""
        found = self._tx(
            "INSERT INTO plumbline_study_claims AS c (study, trial_id, runner, lease_until) VALUES (%s, %s, %s, now() + make_interval(secs => %s)) "
            "ON CONFLICT (study, trial_id) DO UPDATE SET runner = EXCLUDED.runner, lease_until = EXCLUDED.lease_until "
            "WHERE NOT c.decided AND (c.lease_until < now() OR c.runner = EXCLUDED.runner) RETURNING c.trial_id",
            [self.study, trial_id, self.runner, self.lease_s])
        return bool(found)

    def finish(self, trial_id: str, decided: bool) -> None:
        """Let the trial go: decided (ok, errored, stopped) it never runs again; otherwise (missing) it is free at once."""
        self._tx("UPDATE plumbline_study_claims SET decided = %s, lease_until = '-infinity' WHERE study = %s AND trial_id = %s AND runner = %s",
                 [decided, self.study, trial_id, self.runner])

    def renew(self) -> None:
        """Extend this runner's lease and its claims' (the heartbeat calls it every third of a lease)."""
        with self._lock, self.connection.transaction():
            self.connection.execute(
                "INSERT INTO plumbline_study_runners VALUES (%s, %s, %s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (study, runner) DO UPDATE SET lease_until = EXCLUDED.lease_until",
                [self.study, self.runner, _HOST, os.getpid(), self.lease_s])
            self.connection.execute(
                "UPDATE plumbline_study_claims SET lease_until = now() + make_interval(secs => %s) "
                "WHERE study = %s AND runner = %s AND NOT decided AND lease_until > now()",
                [self.lease_s, self.study, self.runner])

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.lease_s / 3):
                self.renew()

        self._beat = threading.Thread(target=beat, name="plumbline-study-lease", daemon=True)
        self._beat.start()

    def close(self) -> None:
        """Stop the heartbeat and give up the lease (this runner's undecided claims are free at once)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self._tx("UPDATE plumbline_study_claims SET lease_until = '-infinity' WHERE study = %s AND runner = %s AND NOT decided",
                 [self.study, self.runner])
        self._tx("UPDATE plumbline_study_runners SET lease_until = '-infinity' WHERE study = %s AND runner = %s", [self.study, self.runner])
        self.connection.close()

    def counts(self) -> dict[str, int]:
        found = self._tx("SELECT count(*) FILTER (WHERE decided), count(*) FILTER (WHERE NOT decided AND lease_until > now()), count(*) "
                         "FROM plumbline_study_claims WHERE study = %s", [self.study])
        decided, held, total = found[0]
        return {"decided": int(decided), "held": int(held), "planned": int(total)}


__all__ = ["PgLedger", "PgSpendCap", "StudyClaims", "connect"]
