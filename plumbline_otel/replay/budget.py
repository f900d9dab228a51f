"""The cumulative spend cap: reserve before spending, settle after, so concurrency cannot overshoot.

``SpendCap`` holds ``spent`` (settled) and ``reserved`` (promised to running trials) under one
lock. A trial reserves its estimate before it starts; ``reserve`` refuses when
``spent + reserved + amount`` would pass the cap, so the sum never exceeds it whatever the
number of threads. Metered model calls (``TrialBudget.ensure`` before each call, ``add`` after)
grow a trial's reservation call by call, so even a trial that costs more than its estimate stops
at the cap instead of passing it. The seed system checked, then spent, then recorded, and eight
workers overshot an $11.00 cap to $11.019.

The cap is cumulative per study: a resumed study starts from the spend its ledger recorded.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from plumbline_otel.errors import ReplayError

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


class UnknownModelPrice(ReplayError):
    """A model with no price while a cap is set: refuse rather than fail open."""


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
    """A study's cap (None: unlimited, spend still counted). Thread-safe."""

    def __init__(self, limit_usd: float | None = None, prior_usd: float = 0.0) -> None:
        self.limit = limit_usd
        self.prior = prior_usd
        self.spent = prior_usd
        self.reserved = 0.0
        self.high_water = prior_usd  # the most ever committed (spent + reserved)
        self.refusals = 0
        self._lock = threading.Lock()

    def reserve(self, amount: float) -> bool:
        """Promise ``amount`` to a trial if the cap allows it (atomically)."""
        amount = max(0.0, amount)
        with self._lock:
            if self.limit is not None and self.spent + self.reserved + amount > self.limit + 1e-12:
                self.refusals += 1
                return False
            self.reserved += amount
            self.high_water = max(self.high_water, self.spent + self.reserved)
            return True

    def settle(self, reserved: float, actual: float) -> None:
        """Release a reservation and record what was actually spent."""
        with self._lock:
            self.reserved = max(0.0, self.reserved - max(0.0, reserved))
            self.spent += max(0.0, actual)
            self.high_water = max(self.high_water, self.spent + self.reserved)

    @property
    def session_usd(self) -> float:
        return self.spent - self.prior

    @property
    def remaining(self) -> float | None:
        with self._lock:
            return None if self.limit is None else max(0.0, self.limit - self.spent - self.reserved)


@dataclass
class TrialBudget:
    """One trial's reservation; metered calls grow it (or are refused) and record their cost."""

    cap: SpendCap
    reserved: float = 0.0
    used: float = 0.0
    metered: bool = False  # any cost recorded through ``add``
    settled: bool = False

    @classmethod
    def open(cls, cap: SpendCap, estimate: float) -> "TrialBudget | None":
        """Reserve ``estimate`` for a new trial; None when the cap refuses."""
        return cls(cap, reserved=max(0.0, estimate)) if cap.reserve(estimate) else None

    def ensure(self, amount: float) -> None:
        """Make sure ``amount`` more can be spent, growing the reservation; raise BudgetExceeded if not."""
        need = self.used + max(0.0, amount) - self.reserved
        if need > 0:
            if not self.cap.reserve(need):
                raise BudgetExceeded(f"spend cap ${self.cap.limit:.2f} reached (spent ${self.cap.spent:.4f}, "
                                     f"${self.cap.reserved:.4f} reserved by running trials)")
            self.reserved += need

    def add(self, amount: float) -> None:
        """Record money actually spent by this trial."""
        self.used += max(0.0, amount)
        self.metered = True

    def close(self, reported: float | None = None) -> float:
        """Settle: metered spend if any, else the adapter's report, else the whole reservation."""
        if self.settled:
            return self.used
        actual = self.used if self.metered else (reported if reported is not None else self.reserved)
        self.used = actual
        self.cap.settle(self.reserved, actual)
        self.settled = True
        return actual
