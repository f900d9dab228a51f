"""The cumulative spend cap: reserve before spending, settle after, so concurrency cannot overshoot.

``SpendCap`` keeps ``spent`` (settled) and ``reserved`` (promised to running trials). A trial
reserves its estimate before it starts; ``reserve`` refuses when ``spent + reserved + amount``
would pass the cap, so the sum never exceeds it whatever the number of threads. Metered model
calls (``TrialBudget.ensure`` before each call, ``add`` after) grow a trial's reservation call
by call, so a trial that costs more than its estimate is stopped at the cap instead of passing
it. The seed system checked, then spent, then recorded, and eight workers overshot an $11.00 cap
to $11.019.

With a journal (the study's ledger file) the account is shared by every process: each
operation takes an exclusive ``flock`` on ``<journal>.lock``, reads the rows other processes
appended since it last looked, decides, and appends its own row, so the ledger is the single
source of truth and two runners cannot both spend the last dollar. A reservation whose process
died before settling stays counted (it may have been spent): the cap errs towards refusing.

An adapter that reports its own cost can only be held to the cap by its reservation, which must
then be an upper bound (a declared per-trial maximum); ``TrialBudget.close`` reconciles the
report against it and says by how much an adapter overran.

Every reservation row carries the pid and host of the process that made it, and every metered
call appends a ``use`` row, so a resumed study can release a dead runner's reservations
(``SpendCap.release_dead``) down to what its metered calls actually spent instead of holding
them forever. A call the cap refuses costs nothing: a trial whose every call was refused settles
at $0, not at its reservation. ``reserve_wait`` lets a trial that does not fit wait for running
trials to settle before the study gives up on it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.ledger import append_line
from plumbline_otel.replay.pricing import PRICE_TABLE, Usage, price

# USD per million tokens (input, output), from the full table in ``pricing`` (cache rates there);
# a model id resolves to its longest matching prefix.
PRICES: dict[str, tuple[float, float]] = {name: (p.input, p.output) for name, p in PRICE_TABLE.items()}
_HOST = socket.gethostname()


class BudgetExceeded(ReplayError):
    """The study's spend cap does not allow this trial (or this model call)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def price_of(model: str | None, prices: dict[str, tuple[float, float]] = PRICES) -> tuple[float, float] | None:
    """(input, output) USD per million tokens, or None when the model is not priced."""
    if not model:
        return None
    matches = [p for p in prices if model.startswith(p)]
    return prices[max(matches, key=len)] if matches else None


def cost_usd(model: str | None, input_tokens: int, output_tokens: int,
             prices: dict[str, tuple[float, float]] = PRICES, *, cache_read_tokens: int = 0,
             cache_write_tokens: int = 0) -> float | None:
    """USD for a call; cache tokens are priced at their own rates (``pricing.price``) with the default table."""
    if prices is PRICES:
        return price(model, Usage(input_tokens, output_tokens, cache_read_tokens, cache_write_tokens))
    rates = price_of(model, prices)
    if rates is None:
        return None
    return (input_tokens * rates[0] + output_tokens * rates[1]) / 1_000_000


@dataclass(frozen=True)
class Reservation:
    """An open reservation as the journal shows it: who made it and what its metered calls spent."""

    rid: str
    usd: float
    used: float
    metered: bool
    pid: int | None
    host: str | None


class SpendCap:
    """A study's cap (None: unlimited, spend still counted). Thread- and, with a journal, process-safe."""

    def __init__(self, limit_usd: float | None = None, prior_usd: float = 0.0, journal: str | Path | None = None) -> None:
        self.limit = limit_usd
        self.journal = Path(journal) if journal is not None else None
        self.refusals = 0
        self._settled = prior_usd  # in-memory account; with a journal, the journal's settled spend
        self._open: dict[str, float] = {}  # reservation id -> amount, every process's
        self._owner: dict[str, tuple[int | None, str | None]] = {}  # reservation id -> (pid, host)
        self._used: dict[str, float] = {}  # reservation id -> metered spend not yet settled
        self._offset = 0
        self._lock = threading.Lock()
        self._settled_event = threading.Condition(threading.Lock())
        self._high_water = prior_usd
        if self.journal is not None:
            with self._locked():
                pass  # read what earlier runs settled
        self.prior = self._settled

    # --- the shared account ---------------------------------------------------------------

    def _sync(self) -> None:
        """Apply the journal rows appended since the last look (caller holds the flock)."""
        assert self.journal is not None
        if not self.journal.exists():
            return
        with self.journal.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # a row still being written is read next time
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict) and "spend" in row:
                self._apply(row)

    def _apply(self, row: dict[str, object]) -> None:
        rid, usd = str(row.get("id")), float(row.get("usd") or 0.0)  # type: ignore[arg-type]
        if row["spend"] == "reserve":
            self._open[rid] = self._open.get(rid, 0.0) + usd
            if rid not in self._owner:
                pid = row.get("pid")
                self._owner[rid] = (pid if isinstance(pid, int) else None, str(row["host"]) if row.get("host") else None)
        elif row["spend"] == "use":
            self._used[rid] = self._used.get(rid, 0.0) + usd
        elif row["spend"] == "settle":
            self._open.pop(rid, None)
            self._owner.pop(rid, None)
            self._used.pop(rid, None)
            self._settled += usd

    def _record(self, row: dict[str, object]) -> None:
        self._apply(row)
        if self.journal is not None:
            append_line(self.journal, orjson.dumps(row) + b"\n")
            self._offset = self.journal.stat().st_size
        self._high_water = max(self._high_water, self._settled + sum(self._open.values()))

    class _Held:
        def __init__(self, cap: SpendCap) -> None:
            self.cap = cap
            self.fd: int | None = None

        def __enter__(self) -> None:
            self.cap._lock.acquire()
            journal = self.cap.journal
            if journal is not None:
                journal.parent.mkdir(parents=True, exist_ok=True)
                self.fd = os.open(f"{journal}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self.fd, fcntl.LOCK_EX)
                self.cap._sync()

        def __exit__(self, *_: object) -> None:
            if self.fd is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            self.cap._lock.release()

    def _locked(self) -> SpendCap._Held:
        return SpendCap._Held(self)

    # --- operations -------------------------------------------------------------------------

    def reserve(self, amount: float, rid: str | None = None) -> bool:
        """Promise ``amount`` (to reservation ``rid``, new if None) if the cap allows it, atomically."""
        amount = max(0.0, amount)
        with self._locked():
            committed = self._settled + sum(self._open.values())
            if self.limit is not None and committed + amount > self.limit + 1e-12:
                self.refusals += 1
                return False
            self._record({"spend": "reserve", "id": rid or uuid.uuid4().hex, "usd": amount, "pid": os.getpid(), "host": _HOST})
            return True

    def fits_eventually(self, amount: float) -> bool:
        """Whether ``amount`` could fit once every open reservation settled at nothing (settled spend only grows)."""
        with self._locked():
            return self.limit is None or self._settled + max(0.0, amount) <= self.limit + 1e-12

    def reserve_wait(self, amount: float, timeout: float, running: Callable[[], bool], rid: str | None = None,
                     poll_s: float = 0.1) -> bool:
        """``reserve``, waiting up to ``timeout`` s for running trials to settle when it does not fit yet.

        Gives up at once when it can never fit (settled spend alone leaves no room), and as soon as
        ``running()`` says no trial is left to settle (nothing more will be freed). Another process
        sharing the journal is seen by polling every ``poll_s``; a settle in this process wakes it.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if self.reserve(amount, rid):
                return True
            if not self.fits_eventually(amount) or not running():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._settled_event:
                self._settled_event.wait(min(poll_s, left))

    def use(self, rid: str, usd: float) -> None:
        """Journal ``usd`` actually spent by a metered call under reservation ``rid`` (what a release keeps)."""
        with self._locked():
            self._record({"spend": "use", "id": rid, "usd": max(0.0, usd), "pid": os.getpid()})

    def reservations(self) -> list[Reservation]:
        """The open reservations of every process sharing the account."""
        with self._locked():
            return [Reservation(rid, usd, self._used.get(rid, 0.0), rid in self._used, *self._owner.get(rid, (None, None)))
                    for rid, usd in self._open.items()]

    def release_dead(self, pids: Iterable[int] | None = None, *, host: str | None = None) -> list[Reservation]:
        """Settle the open reservations of processes that are gone, so they stop holding the cap.

        ``pids``: the dead runners' pids (None: every pid on this host that no longer exists). A
        reservation whose calls were metered settles at what they spent; one with no metered call
        (a self-reporting adapter, whose spend nobody saw) settles at its full amount, since it may
        have been spent. Returns what it released. Only reservations made on ``host`` (default this
        one) are matched, so a pid from another machine is never taken for a local one.
        """
        host = host or _HOST
        wanted = set(pids) if pids is not None else None
        released: list[Reservation] = []
        with self._locked():
            for rid, usd in list(self._open.items()):
                pid, owner_host = self._owner.get(rid, (None, None))
                if pid is None or pid == os.getpid() or (owner_host is not None and owner_host != host):
                    continue
                if (wanted is not None and pid not in wanted) or (wanted is None and _alive(pid)):
                    continue
                metered = rid in self._used
                actual = self._used[rid] if metered else usd
                released.append(Reservation(rid, usd, actual, metered, pid, owner_host))
                self._record({"spend": "settle", "id": rid, "usd": actual, "pid": os.getpid(), "released_pid": pid})
        if released:
            self._wake()
        return released

    def _wake(self) -> None:
        with self._settled_event:
            self._settled_event.notify_all()

    def open(self, amount: float) -> str | None:
        """A new reservation of ``amount``: its id, or None when the cap refuses."""
        rid = uuid.uuid4().hex
        return rid if self.reserve(amount, rid) else None

    def settle(self, rid: str, actual: float) -> None:
        """Release reservation ``rid`` and record what was actually spent."""
        with self._locked():
            self._record({"spend": "settle", "id": rid, "usd": max(0.0, actual), "pid": os.getpid()})
        self._wake()

    @property
    def spent(self) -> float:
        with self._locked():
            return self._settled

    @property
    def reserved(self) -> float:
        with self._locked():
            return sum(self._open.values())

    @property
    def high_water(self) -> float:
        """The most this process saw committed (spent + reserved) at any moment."""
        return self._high_water

    @property
    def session_usd(self) -> float:
        return self.spent - self.prior

    @property
    def remaining(self) -> float | None:
        with self._locked():
            committed = self._settled + sum(self._open.values())
            return None if self.limit is None else max(0.0, self.limit - committed)


@dataclass
class TrialBudget:
    """One trial's reservation; metered calls grow it (or are refused) and record their cost."""

    cap: SpendCap
    rid: str
    reserved: float = 0.0
    used: float = 0.0
    metered: bool = False  # any cost recorded through ``add``
    settled: bool = False
    overrun: float = 0.0  # what an adapter reported beyond its reservation
    refused: int = 0  # metered calls the cap refused (they cost nothing)
    estimated: int = 0  # metered calls whose usage the meter never saw: charged an upper-bound estimate from their text
    unseen: int = 0  # ... and with no price to estimate from: the trial settles at no less than its reservation
    raised: bool = False  # an adapter's report was above what the meter or the reservation said: settled as reported
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, cap: SpendCap, estimate: float) -> TrialBudget | None:
        """Reserve ``estimate`` for a new trial; None when the cap refuses."""
        rid = cap.open(estimate)
        return cls(cap, rid, reserved=max(0.0, estimate)) if rid is not None else None

    @classmethod
    def open_wait(cls, cap: SpendCap, estimate: float, timeout: float, running: Callable[[], bool]) -> TrialBudget | None:
        """``open``, waiting for running trials to settle when the reservation does not fit yet."""
        rid = uuid.uuid4().hex
        return cls(cap, rid, reserved=max(0.0, estimate)) if cap.reserve_wait(estimate, timeout, running, rid) else None

    def ensure(self, amount: float) -> None:
        """Make sure ``amount`` more can be spent, growing the reservation; raise BudgetExceeded if not.

        A refusal makes the trial metered: its calls are what it spent, so a trial whose every
        call was refused settles at nothing rather than at its reservation.
        """
        with self._lock:
            need = self.used + max(0.0, amount) - self.reserved
            if need > 0:
                if not self.cap.reserve(need, self.rid):
                    self.refused += 1
                    self.metered = True
                    raise BudgetExceeded(f"spend cap ${self.cap.limit:.2f} reached (spent ${self.cap.spent:.4f}, "
                                         f"${self.cap.reserved:.4f} reserved by running trials)")
                self.reserved += need

    def add(self, amount: float) -> None:
        """Record money actually spent by this trial."""
        with self._lock:
            self.used += max(0.0, amount)
            self.metered = True
        self.cap.use(self.rid, amount)

    def add_estimate(self, amount: float | None) -> None:
        """A call went through the meter but its usage never came (a stream without usage, one abandoned part-way):
        it costs `amount`, an estimate from its text, or (None: no price to estimate with) no less than the reservation.
        Never $0 metered."""
        with self._lock:
            self.metered = True
            if amount is None:
                self.unseen += 1
                return
            self.used += max(0.0, amount)
            self.estimated += 1
        self.cap.use(self.rid, amount)

    @property
    def basis(self) -> str:
        """Whose figure the settled cost is (`runs.COST_BASIS`): adapter (its report raised the charge), reservation (no
        meter saw every call), estimated (some calls' usage unseen, charged an estimate) or metered."""
        if self.raised:
            return "adapter"
        if not self.metered or self.unseen:
            return "reservation"
        return "estimated" if self.estimated else "metered"

    def close(self, reported: float | None = None, ran: bool = True) -> float:
        """Settle: what a meter counted, else (the agent ran, so it may have spent) the whole reservation; an
        adapter's report may raise that, never lower it: an agent that says it cost $0 is not believed.

        A report above the reservation is settled as reported (it is what was spent) and kept
        in ``overrun``, so the driver can stop a capped study and say which adapter broke its maximum.
        """
        with self._lock:
            if self.settled:
                return self.used
            if self.metered:
                floor = max(self.used, self.reserved) if self.unseen else self.used
            else:
                floor = self.reserved if ran else 0.0
            actual = max(floor, reported or 0.0)
            self.raised = reported is not None and reported > floor
            self.overrun = max(0.0, actual - self.reserved)
            self.used = actual
            self.cap.settle(self.rid, actual)
            self.settled = True
            return actual
