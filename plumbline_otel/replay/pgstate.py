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

**Fencing.** Every claim of a trial takes a new fencing token. A runner that was paused past its lease
(not dead) and comes back may find its trial taken over: its outcome is then refused (`PgLedger.append`
checks the claim under a row lock in the transaction that would record it, and marks a decided trial
decided in that same transaction), so it records a *duplicate execution* instead of a result; its
released reservation cannot grow again, and its late settlement adds only what it spent after the
release (the account never counts one reservation twice). A joining runner records as interrupted only
attempts whose runner's lease expired (`PgLedger.unfinished`), and only after taking their claims.

**A Postgres restart** (or a dropped connection) does not end a runner: every operation reconnects
with back-off (0.25 s doubling to 8 s, for up to ``PLUMBLINE_PG_RECONNECT_S``, default 120 s) and
is done again in a new transaction; a row whose commit was cut off is found by its write id (``w``)
and never appended twice, and rows other runners appended meanwhile are applied first. The heartbeat
goes on through the outage; a lease that lapsed meanwhile is renewed if no runner took its trials.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.budget import BudgetExceeded, Reservation, SpendCap
from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue, to_int
from plumbline_otel.replay.ledger import Ledger
from plumbline_otel.trials import KeyRing

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg.rows import TupleRow

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
    # the fencing token: taken anew by every claim, so an outcome from a runner that lost the trial is refused
    "ALTER TABLE plumbline_study_claims ADD COLUMN IF NOT EXISTS token BIGINT NOT NULL DEFAULT 0",
]
_T = TypeVar("_T")


class LeaseLost(ReplayError):
    """This runner no longer holds the trial: another runner took it over after this one's lease lapsed."""

    def __init__(self, trial_id: str, holder: str | None) -> None:
        self.trial_id, self.holder = trial_id, holder
        who = f"runner {holder}" if holder else "another runner"
        super().__init__(f"fenced: this runner's lease on {trial_id} lapsed and {who} took the trial over; this execution "
                         "is a duplicate, never the trial's result")


def _reconnect_s() -> float:
    try:
        return float(os.environ.get("PLUMBLINE_PG_RECONNECT_S", "120"))
    except ValueError:
        return 120.0


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` is the connection going away (a server restart, a dropped socket), which a new connection cures."""
    import psycopg

    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))


def _say(message: str) -> None:
    print(f"plumbline replay: {message}", file=sys.stderr, flush=True)


def connect(url: str, schema: bool = True) -> Connection[TupleRow]:
    """A psycopg connection to the study state, its tables made on first use (by whichever runner comes first).

    A reconnection (`reconnect`) skips the schema: it was made when this runner first connected, and its DDL takes
    table locks that deadlock against the other runners' transactions all reconnecting at once after a restart."""
    import psycopg

    try:
        connection = psycopg.connect(url, autocommit=False)
    except psycopg.Error as exc:
        raise ReplayError(f"--state-url: cannot connect: {str(exc).strip()}") from None
    if schema:
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(hashtext('plumbline_study_schema'))")
            for statement in _SCHEMA:
                connection.execute(statement)
    return connection


def reconnect(url: str, old: Connection[TupleRow], why: BaseException, what: str) -> Connection[TupleRow]:
    """A new connection after ``old`` was lost, tried with back-off (0.25 s doubling to 8 s) for up to
    ``PLUMBLINE_PG_RECONNECT_S``: a restarted Postgres takes seconds to take connections again, and a runner that
    gave up at the first refusal would leave its running trials unrecorded."""
    try:
        old.close()
    except Exception:  # already gone
        pass
    deadline = time.monotonic() + _reconnect_s()
    delay, tries = 0.25, 0
    _say(f"lost the study state's Postgres during {what} ({str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__}); "
         "reconnecting with back-off")
    while True:
        tries += 1
        try:
            connection = connect(url, schema=False)
        except ReplayError as exc:
            if time.monotonic() + delay > deadline:
                raise ReplayError(f"--state-url: Postgres unreachable for {_reconnect_s():g}s after {tries} attempt(s): {exc}") from None
            time.sleep(delay)
            delay = min(8.0, delay * 2)
            continue
        _say(f"reconnected to the study state's Postgres after {tries} attempt(s); going on")
        return connection


class _Rows:
    """One study's rows of one kind: appended and read in commit order under the kind's advisory lock.

    Transactions are explicit (``commit`` / ``rollback``) so that one cut off by a lost connection can be taken up
    again on a new one (`_recover`): the advisory lock taken anew, the rows others appended meanwhile handed to
    ``on_foreign``, and this transaction's own rows appended again unless their commit had landed (found by ``w``)."""

    def __init__(self, url: str, study: str, kind: str, on_foreign: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.url = url
        self.connection = connect(url)
        self.study, self.kind = study, kind
        self.seq = 0
        self.lock = threading.RLock()
        self.on_foreign = on_foreign
        self._pending: list[dict[str, Any]] = []  # rows appended in the open transaction
        self._depth = 0

    def _lock_sql(self) -> None:
        self.connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"{self.study}:{self.kind}"])

    def _rollback(self) -> None:
        try:
            self.connection.rollback()
        except Exception:  # a broken connection has nothing to roll back
            pass

    def _recover(self, why: BaseException) -> list[dict[str, Any]]:
        """A new connection and transaction holding the lock, in the state the lost one had reached; the rows other
        runners appended meanwhile (returned, and given to ``on_foreign`` unless the caller reads them itself)."""
        while True:
            self.connection = reconnect(self.url, self.connection, why, f"the study's {self.kind} rows")
            try:
                self._lock_sql()
                found = self.connection.execute("SELECT seq, row FROM plumbline_study_rows WHERE study = %s AND kind = %s AND seq > %s "
                                                "ORDER BY seq", [self.study, self.kind, self.seq]).fetchall()
                landed = {str(row.get("w")) for _, row in found if isinstance(row, dict) and row.get("w")}
                foreign = [row for _, row in found if not (isinstance(row, dict) and row.get("w") in {p["w"] for p in self._pending})]
                if found:
                    self.seq = int(found[-1][0])
                for row in self._pending:
                    if row["w"] not in landed:
                        self._insert(row)
                return foreign
            except Exception as exc:
                if not _lost(exc):
                    raise
                why = exc

    @contextmanager
    def locked(self) -> Iterator[None]:
        """A transaction holding the study's lock of this kind: rows appended inside it commit together."""
        with self.lock:
            if self._depth:  # already inside one: the same transaction
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._pending = []
            try:
                self._lock_sql()
            except Exception as exc:
                if not _lost(exc):
                    self._rollback()
                    raise
                self._foreign(self._recover(exc))
            self._depth = 1
            try:
                yield
            except BaseException:
                self._rollback()
                raise
            finally:
                self._depth = 0
            while True:
                try:
                    self.connection.commit()
                    break
                except Exception as exc:  # cut off at commit: whether it landed is found by the rows' write ids
                    if not _lost(exc):
                        self._rollback()
                        raise
                    self._foreign(self._recover(exc))
            self._pending = []

    def _foreign(self, rows: list[dict[str, Any]]) -> None:
        if rows and self.on_foreign is not None:
            self.on_foreign(rows)

    def since(self) -> list[dict[str, Any]]:
        """Rows appended since the last call (call it under `locked`: seq order is commit order then)."""
        try:
            found = self.connection.execute("SELECT seq, row FROM plumbline_study_rows WHERE study = %s AND kind = %s AND seq > %s "
                                            "ORDER BY seq", [self.study, self.kind, self.seq]).fetchall()
        except Exception as exc:
            if not _lost(exc):
                raise
            return self._recover(exc)
        if found:
            self.seq = int(found[-1][0])
        return [row for _, row in found]

    def _insert(self, row: dict[str, Any]) -> None:
        found = self.connection.execute("INSERT INTO plumbline_study_rows (study, kind, row) VALUES (%s, %s, %s::jsonb) RETURNING seq",
                                        [self.study, self.kind, orjson.dumps(row, default=str).decode()]).fetchone()
        assert found is not None  # INSERT … RETURNING returns the row it inserted
        self.seq = int(found[0])

    def append(self, row: dict[str, Any]) -> None:
        """Append a row (under `locked`, after `since`: every earlier row has been read, so ours is not read back).
        The row gets a write id ``w``, by which a commit cut off by a lost connection is known to have landed or not."""
        row.setdefault("w", uuid.uuid4().hex)
        self._pending.append(row)
        try:
            self._insert(row)
        except Exception as exc:
            if not _lost(exc):
                raise
            self._foreign(self._recover(exc))  # appends the pending rows, this one included

    def execute(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Another statement in the open transaction (under `locked`), taken up again on a new connection if lost."""
        while True:
            try:
                cursor = self.connection.execute(sql, params)
                return cursor.fetchall() if cursor.description else []
            except Exception as exc:
                if not _lost(exc):
                    raise
                self._foreign(self._recover(exc))

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # already gone
            pass


def shared_state(url: str, study: str, make: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The shared study's one instance id and secret key (`trials.KeyRing`): the first runner makes them, every
    other runner and `certify --state-url` reads the same, so records of every runner verify under one key."""
    rows = _Rows(url, study, "state")
    try:
        with rows.locked():
            found = rows.since()
            if found:
                return {k: v for k, v in dict(found[0]).items() if k != "w"}
            made = make()
            rows.append(dict(made))
            return made
    finally:
        rows.close()


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
        self._released: dict[str, float] = {}  # reservation id -> what another runner settled it at (release_dead)
        self._rows = _Rows(url, study, "spend", on_foreign=self._apply_rows)
        self.runner = runner or f"{_HOST}:{os.getpid()}"
        super().__init__(limit_usd)  # reads what earlier runs settled (`_locked`)
        with self._locked():
            pass
        self.prior = self._settled

    def _apply_rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if "spend" in row:
                self._apply(row)

    class _PgHeld:
        def __init__(self, cap: PgSpendCap) -> None:
            self.cap = cap
            self._inner: Any = None

        def __enter__(self) -> None:
            self.cap._lock.acquire()
            try:
                self._inner = self.cap._rows.locked()
                self._inner.__enter__()
                self.cap._apply_rows(self.cap._rows.since())
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

    def _apply(self, row: dict[str, object]) -> None:
        if row.get("spend") == "settle" and row.get("released_runner"):
            self._released[str(row.get("id"))] = float(row.get("usd") or 0.0)  # type: ignore[arg-type]
        super()._apply(row)

    def _record(self, row: dict[str, object]) -> None:
        """Append a spend row. A reservation another runner released (its runner's lease lapsed) is fenced: it cannot
        grow again, and its own late settlement adds only what was spent beyond what the release already counted."""
        rid = str(row.get("id"))
        if rid in self._released and rid not in self._open:
            if row["spend"] == "reserve":
                raise BudgetExceeded(f"fenced: reservation {rid} was released by another runner after this runner's lease lapsed")
            if row["spend"] == "settle":
                released = self._released.pop(rid)
                row = {**row, "usd": max(0.0, float(row.get("usd") or 0.0) - released),  # type: ignore[arg-type]
                       "late": True, "released_at_usd": released}
        row = {**row, "runner": self.runner}
        self._rows.append(row)  # first: a row that never reached Postgres never counts here either
        self._apply(row)
        self._high_water = max(self._high_water, self._settled + sum(self._open.values()))

    def release_dead(self, pids: Iterable[int] | None = None, *, host: str | None = None) -> list[Reservation]:
        """Settle the open reservations of runners whose lease expired (any machine), at what their calls metered."""
        released: list[Reservation] = []
        with self._locked():
            expired = {r for (r,) in self._rows.execute(
                "SELECT runner FROM plumbline_study_runners WHERE study = %s AND lease_until < now()", [self._rows.study])}
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
        found = self._rows.execute(
            "SELECT row->>'id', row->>'runner' FROM plumbline_study_rows WHERE study = %s AND kind = 'spend' AND row->>'spend' = 'reserve'",
            [self._rows.study])
        return {rid: runner for rid, runner in found if runner}


class PgLedger(Ledger):
    """`Ledger` whose rows are the study's ledger rows in Postgres (attempt numbers are never reused across runners).

    With ``fence`` (the runner's `StudyClaims`), an attempt's outcome is recorded only while this runner still
    holds the trial's claim with the token it took: checked under a row lock on the claim in the very
    transaction that appends the outcome, which also marks a decided trial decided, so no other runner can take
    the trial between the check and the record. Otherwise `LeaseLost`."""

    def __init__(self, url: str, study: str) -> None:
        self._rows = _Rows(url, study, "ledger", on_foreign=self._extend)
        self.fence: StudyClaims | None = None
        super().__init__(f"postgres:{study}")

    def _extend(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)

    def reload(self) -> None:
        with self._rows.locked():
            self._rows.seq = 0
            self.rows = []
            self.rows = self._rows.since()

    def begin_attempt(self, trial_id: str) -> int:
        with self._lock, self._rows.locked():
            self.rows.extend(self._rows.since())
            attempt = 1 + max((to_int(r.get("attempt") or 0) for r in self.rows if r.get("trial_id") == trial_id), default=0)
            row: JsonObject = {"trial_id": trial_id, "attempt": attempt, "status": "started", "pid": os.getpid(), "host": _HOST,
                   "runner": self.fence.runner if self.fence is not None else f"{_HOST}:{os.getpid()}"}
            self._rows.append(row)
            self.rows.append(row)
            return attempt

    def append(self, row: JsonObject) -> None:
        row = orjson.loads(orjson.dumps(row, default=str))
        trial_id, status = row.get("trial_id"), row.get("status")
        fence = self.fence
        fenced = fence is not None and isinstance(trial_id, str) and status not in (None, "started", "duplicate") \
            and trial_id in fence.tokens
        with self._lock, self._rows.locked():
            self.rows.extend(self._rows.since())
            if fenced:
                assert fence is not None and isinstance(trial_id, str)
                held = self._rows.execute("SELECT runner, token FROM plumbline_study_claims WHERE study = %s AND trial_id = %s FOR UPDATE",
                                          [self._rows.study, trial_id])
                if not held or (held[0][0], int(held[0][1])) != (fence.runner, fence.tokens[trial_id]):
                    raise LeaseLost(trial_id, held[0][0] if held else None)
                if status in ("ok", "errored", "stopped"):  # decided with its record: no runner takes it after this
                    self._rows.execute("UPDATE plumbline_study_claims SET decided = true, lease_until = '-infinity', runner = NULL "
                                       "WHERE study = %s AND trial_id = %s", [self._rows.study, trial_id])
            self._rows.append(row)
            self.rows.append(row)

    def unfinished(self) -> dict[str, tuple[int, JsonValue]]:
        """Attempts started and never finished whose runner's lease has expired (dead, or paused past its lease): a live
        runner's attempts in flight are its own, never interrupted by a runner that joins or resumes the study."""
        with self._lock, self._rows.locked():
            self.rows.extend(self._rows.since())
            live = {r for (r,) in self._rows.execute(
                "SELECT runner FROM plumbline_study_runners WHERE study = %s AND lease_until > now()", [self._rows.study])}
        found = super().unfinished()
        last = {row["trial_id"]: row for row in self.rows if "trial_id" in row and "status" in row}
        return {tid: v for tid, v in found.items()
                if (last[tid].get("runner") or f"{last[tid].get('host')}:{last[tid].get('pid')}") not in live}


class StudyClaims:
    """Which runner holds which trial: claimed with row locks, held by a lease its heartbeat renews, fenced by a token."""

    def __init__(self, url: str, study: str, runner: str | None = None, lease_s: float | None = None) -> None:
        self.url = url
        self.connection = connect(url)
        # The lease: how long a runner that stops renewing (killed, paused, cut off) keeps its trials. Default 30 s;
        # PLUMBLINE_STUDY_LEASE_S for all runners of a study (a shorter lease frees a dead runner's trials sooner).
        self.study, self.lease_s = study, lease_s if lease_s is not None else float(os.environ.get("PLUMBLINE_STUDY_LEASE_S", "30"))
        self.runner = runner or f"{_HOST}:{os.getpid()}"  # as PgSpendCap names it
        self.tokens: dict[str, int] = {}  # trial id -> the fencing token this runner's claim took
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.renew()

    def _tx(self, sql: str, params: Sequence[Any]) -> list[Any]:
        def run() -> list[Any]:
            cursor = self.connection.execute(sql, params)
            return cursor.fetchall() if cursor.description else []
        return self._retrying(run, "a trial claim")

    def _retrying(self, work: Callable[[], _T], what: str) -> _T:
        """``work`` in a transaction, done again on a new connection if the old one was lost (each use is idempotent:
        a claim this runner already holds is taken again, a finish or renewal done twice is the same)."""
        with self._lock:
            while True:
                try:
                    with self.connection.transaction():
                        return work()
                except Exception as exc:
                    if not _lost(exc):
                        raise
                    self.connection = reconnect(self.url, self.connection, exc, what)

    def plan(self, trial_ids: Sequence[str]) -> None:
        """Add the study's planned trials (those already there keep their state)."""
        def run() -> None:
            with self.connection.cursor() as cursor:
                cursor.executemany("INSERT INTO plumbline_study_claims (study, trial_id, ord) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                                   [(self.study, t, i) for i, t in enumerate(trial_ids)])
        self._retrying(run, "planning the trials")

    def claim_next(self) -> str | None:
        """The first trial no live runner holds and none decided, now this runner's; None when there is none."""
        found = self._tx(
            "UPDATE plumbline_study_claims c SET runner = %s, lease_until = now() + make_interval(secs => %s), token = c.token + 1 "
            "WHERE (c.study, c.trial_id) = (SELECT study, trial_id FROM plumbline_study_claims WHERE study = %s AND NOT decided "
            "AND lease_until < now() ORDER BY ord, trial_id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING c.trial_id, c.token",
            [self.runner, self.lease_s, self.study])
        if not found:
            return None
        self.tokens[str(found[0][0])] = int(found[0][1])
        return str(found[0][0])

    def claim(self, trial_id: str) -> bool:
        """Take this trial if no live runner holds it and it is not decided (a new fencing token either way)."""
        found = self._tx(
            "INSERT INTO plumbline_study_claims AS c (study, trial_id, runner, lease_until, token) "
            "VALUES (%s, %s, %s, now() + make_interval(secs => %s), 1) "
            "ON CONFLICT (study, trial_id) DO UPDATE SET runner = EXCLUDED.runner, lease_until = EXCLUDED.lease_until, token = c.token + 1 "
            "WHERE NOT c.decided AND (c.lease_until < now() OR c.runner = EXCLUDED.runner) RETURNING c.trial_id, c.token",
            [self.study, trial_id, self.runner, self.lease_s])
        if found:
            self.tokens[trial_id] = int(found[0][1])
        return bool(found)

    def holder(self, trial_id: str) -> str | None:
        """The runner that holds the trial now (None: nobody)."""
        found = self._tx("SELECT runner FROM plumbline_study_claims WHERE study = %s AND trial_id = %s", [self.study, trial_id])
        return str(found[0][0]) if found and found[0][0] else None

    def finish(self, trial_id: str, decided: bool) -> None:
        """Let the trial go: decided (ok, errored, stopped) it never runs again; otherwise (missing) it is free at once.
        Only the claim this runner still holds, under its token: a trial another runner took over stays theirs."""
        token = self.tokens.pop(trial_id, None)
        self._tx("UPDATE plumbline_study_claims SET decided = decided OR %s, lease_until = '-infinity', runner = NULL "
                 "WHERE study = %s AND trial_id = %s AND runner = %s AND (%s::bigint IS NULL OR token = %s::bigint)",
                 [decided, self.study, trial_id, self.runner, token, token])

    def renew(self) -> None:
        """Extend this runner's lease and its claims' (the heartbeat calls it every third of a lease). A claim whose lease
        lapsed (a pause, a Postgres outage) is renewed as long as no other runner took it: its token is unchanged."""
        def run() -> None:
            self.connection.execute(
                "INSERT INTO plumbline_study_runners VALUES (%s, %s, %s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (study, runner) DO UPDATE SET lease_until = EXCLUDED.lease_until",
                [self.study, self.runner, _HOST, os.getpid(), self.lease_s])
            self.connection.execute(
                "UPDATE plumbline_study_claims SET lease_until = now() + make_interval(secs => %s) "
                "WHERE study = %s AND runner = %s AND NOT decided",
                [self.lease_s, self.study, self.runner])
        self._retrying(run, "the lease heartbeat")

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.lease_s / 3):
                try:
                    self.renew()
                except Exception as exc:  # Postgres gone for longer than the reconnect allows: say so, keep trying
                    _say(f"could not renew the study lease: {exc}")

        self._beat = threading.Thread(target=beat, name="plumbline-study-lease", daemon=True)
        self._beat.start()

    def close(self) -> None:
        """Stop the heartbeat and give up the lease (this runner's undecided claims are free at once)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self._tx("UPDATE plumbline_study_claims SET lease_until = '-infinity', runner = NULL WHERE study = %s AND runner = %s AND NOT decided",
                 [self.study, self.runner])
        self._tx("UPDATE plumbline_study_runners SET lease_until = '-infinity' WHERE study = %s AND runner = %s", [self.study, self.runner])
        self.connection.close()

    def counts(self) -> dict[str, int]:
        found = self._tx("SELECT count(*) FILTER (WHERE decided), count(*) FILTER (WHERE NOT decided AND lease_until > now()), count(*) "
                         "FROM plumbline_study_claims WHERE study = %s", [self.study])
        decided, held, total = found[0]
        return {"decided": int(decided), "held": int(held), "planned": int(total)}


__all__ = ["LeaseLost", "PgLedger", "PgSpendCap", "StudyClaims", "connect"]
