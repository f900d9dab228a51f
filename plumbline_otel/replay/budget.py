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
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.ledger import append_line

# USD per million tokens (input, output); a model id resolves to its longest matching prefix.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "simulated-": (0.0, 0.0),  # the offline simulated model costs nothing
}


class BudgetExceeded(ReplayError):
    """The study's spend cap does not allow this trial (or this model call)."""


def price_of(model: str | None, prices: dict[str, tuple[float, float]] = PRICES) -> tuple[float, float] | None:
    """(input, output) USD per million tokens, or None when the model is not priced."""
    if not model:
        return None
    matches = [p for p in prices if model.startswith(p)]
    return prices[max(matches, key=len)] if matches else None


def cost_usd(model: str | None, input_tokens: int, output_tokens: int,
             prices: dict[str, tuple[float, float]] = PRICES) -> float | None:
    price = price_of(model, prices)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000


class SpendCap:
    """A study's cap (None: unlimited, spend still counted). Thread- and, with a journal, process-safe."""

    def __init__(self, limit_usd: float | None = None, prior_usd: float = 0.0, journal: str | Path | None = None) -> None:
        self.limit = limit_usd
        self.journal = Path(journal) if journal is not None else None
        self.refusals = 0
        self._settled = prior_usd  # in-memory account; with a journal, the journal's settled spend
        self._open: dict[str, float] = {}  # reservation id -> amount, every process's
        self._offset = 0
        self._lock = threading.Lock()
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
        elif row["spend"] == "settle":
            self._open.pop(rid, None)
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
            self._record({"spend": "reserve", "id": rid or uuid.uuid4().hex, "usd": amount, "pid": os.getpid()})
            return True

    def open(self, amount: float) -> str | None:
        """A new reservation of ``amount``: its id, or None when the cap refuses."""
        rid = uuid.uuid4().hex
        return rid if self.reserve(amount, rid) else None

    def settle(self, rid: str, actual: float) -> None:
        """Release reservation ``rid`` and record what was actually spent."""
        with self._locked():
            self._record({"spend": "settle", "id": rid, "usd": max(0.0, actual), "pid": os.getpid()})

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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, cap: SpendCap, estimate: float) -> TrialBudget | None:
        """Reserve ``estimate`` for a new trial; None when the cap refuses."""
        rid = cap.open(estimate)
        return cls(cap, rid, reserved=max(0.0, estimate)) if rid is not None else None

    def ensure(self, amount: float) -> None:
        """Make sure ``amount`` more can be spent, growing the reservation; raise BudgetExceeded if not."""
        with self._lock:
            need = self.used + max(0.0, amount) - self.reserved
            if need > 0:
                if not self.cap.reserve(need, self.rid):
                    raise BudgetExceeded(f"spend cap ${self.cap.limit:.2f} reached (spent ${self.cap.spent:.4f}, "
                                         f"${self.cap.reserved:.4f} reserved by running trials)")
                self.reserved += need

    def add(self, amount: float) -> None:
        """Record money actually spent by this trial."""
        with self._lock:
            self.used += max(0.0, amount)
            self.metered = True

    def close(self, reported: float | None = None) -> float:
        """Settle: metered spend if any, else the adapter's report, else the whole reservation.

        A report above the reservation is settled as reported (it is what was spent) and kept
        in ``overrun``, so the driver can stop the study and say which adapter broke its maximum.
        """
        with self._lock:
            if self.settled:
                return self.used
            actual = self.used if self.metered else (reported if reported is not None else self.reserved)
            self.overrun = max(0.0, actual - self.reserved)
            self.used = actual
            self.cap.settle(self.rid, actual)
            self.settled = True
            return actual
