"""Per-trial fault injection: a declarative spec, and an injector built fresh from it per trial.

The seed system kept its "already fired" flag in a closure shared by every arm and repeat of a
variant, so a fault fired once per variant per process and most trials never saw it. Here the
spec is an immutable value (safe to share), and the mutable :class:`FaultInjector` is created by
``run_trial`` for exactly one trial and dropped with it. The injector records every call it
failed, so each trial's result says whether its fault fired and at which tool step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRANSIENT_KINDS = ("503", "429", "timeout", "connection_reset")

_MESSAGES = {
    "503": "503 Service Unavailable: the {tool} backend is temporarily unavailable",
    "429": "429 Too Many Requests: rate limit exceeded calling {tool}, retry later",
    "timeout": "timeout: {tool} did not answer within 10s",
    "connection_reset": "connection reset by peer while calling {tool}",
}


@dataclass(frozen=True)
class FaultSpec:
    """Fail calls of ``tool`` with a transient error of ``kind``.

    ``on_call`` is the 1-based number of the call of that tool (within one trial) that fails
    first; ``times`` consecutive calls fail from there (so ``times=1`` is one failure followed by
    normal service). Text form for the CLI: ``tool:kind[:on_call[:times]]``.
    """

    tool: str
    kind: str = "503"
    on_call: int = 1
    times: int = 1

    def __post_init__(self) -> None:
        if self.kind not in TRANSIENT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(TRANSIENT_KINDS)}")
        if self.on_call < 1 or self.times < 1:
            raise ValueError("fault on_call and times must be at least 1")

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``check_duplicate:503``, ``validate_tax:timeout:1:2`` -> FaultSpec."""
        parts = [p.strip() for p in text.split(":")]
        if len(parts) < 2 or not parts[0]:
            raise ValueError(f"fault {text!r}: expected tool:kind[:on_call[:times]]")
        numbers = [int(p) for p in parts[2:4]]
        return cls(parts[0], parts[1], *numbers)

    def __str__(self) -> str:
        return f"{self.tool}:{self.kind}:{self.on_call}:{self.times}"


@dataclass
class FaultInjector:
    """The mutable state of one trial's fault; never share one between trials."""

    spec: FaultSpec
    calls_seen: int = 0
    fired_steps: list[int] = field(default_factory=list)

    def before_call(self, tool: str, step: int) -> None:
        """Raise the spec's transient error if this call (tool step ``step``) is a faulted one."""
        if tool != self.spec.tool:
            return
        self.calls_seen += 1
        first = self.spec.on_call
        if first <= self.calls_seen < first + self.spec.times:
            self.fired_steps.append(step)
            raise make_transient_error(self.spec.kind, tool)

    @property
    def fired(self) -> bool:
        return bool(self.fired_steps)

    @property
    def first_step(self) -> int | None:
        return self.fired_steps[0] if self.fired_steps else None


def make_transient_error(kind: str, tool: str) -> Exception:
    """The domain's ``TransientToolError`` for ``kind``, with a realistic message."""
    from domains.accounts_payable.tools import TransientToolError

    return TransientToolError(kind, _MESSAGES[kind].format(tool=tool))
