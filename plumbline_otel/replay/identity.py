"""Who a trial is, and how that identity travels to an agent: span attributes, W3C baggage,
``OTEL_RESOURCE_ATTRIBUTES`` and a W3C trace context.

Everything here is pure. A trial id is readable and deterministic
(``study/task_key/perturbation/variant/kN``), so re-running a study names the same trials and
resume can recognise them. Every *attempt* of a trial (a retry, a resumed run, an explicit
re-run) is one execution with its own trace id, derived from a random nonce the driver mints for
that attempt (`at_attempt`): two executions never share a trace, even from two state directories
of one study, so the store can never merge them into one trajectory (the seed of 22 false "paid
twice" violations), and no agent can compute another trial's trace to write into it. The
driver's record of each attempt goes into a random trace of its own, never the attempt's.

On a ``tool_fault`` trial the identity also carries the fault evidence the certificate matches:
the targeted tool and the exact error text the injector raises (``FaultPlan.error_message``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote

from plumbline_otel.runs import (
    FAULT_ERROR,
    FAULT_TOOL,
    INSTANCE,
    PERTURBATION,
    REPEAT,
    STUDY,
    TASK_KEY,
    TRIAL_ATTEMPT,
    TRIAL_ID,
    VARIANT,
)

TRANSIENT_FAULT_KINDS = ("503", "429", "timeout", "connection_reset")
_FAULT_MESSAGES = {
    "503": "503 Service Unavailable: the {tool} backend is temporarily unavailable",
    "429": "429 Too Many Requests: rate limit exceeded calling {tool}, retry later",
    "timeout": "timeout: {tool} did not answer within 10s",
    "connection_reset": "connection reset by peer while calling {tool}",
}


@dataclass(frozen=True)
class FaultPlan:
    """A declarative tool fault: fail call number ``on_call`` of ``tool`` (and ``times - 1`` more).

    Immutable, so one plan can be shared by every trial of a variant; each trial builds its own
    injector from it (``scope.FaultInjector``), so every trial sees its fault.
    """

    tool: str
    kind: str = "503"
    on_call: int = 1
    times: int = 1

    def __post_init__(self) -> None:
        if not self.tool:
            raise ValueError("a fault needs a tool")
        if self.kind not in TRANSIENT_FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(TRANSIENT_FAULT_KINDS)}")
        if self.on_call < 1 or self.times < 1:
            raise ValueError("fault on_call and times must be at least 1")

    def __str__(self) -> str:
        return f"{self.tool}:{self.kind}:{self.on_call}:{self.times}"

    @property
    def error_message(self) -> str:
        """The exact text the injected error carries; recorded as ``plumbline.fault.error`` so the
        store can match a failed step to this fault (and to nothing else)."""
        return _FAULT_MESSAGES[self.kind].format(tool=self.tool)

    def attributes(self) -> dict[str, str]:
        """``plumbline.fault.tool`` and ``plumbline.fault.error``: what any attempt may be matched on."""
        return {FAULT_TOOL: self.tool, FAULT_ERROR: self.error_message}

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``tool:kind[:on_call[:times]]``."""
        parts = [p.strip() for p in text.split(":")]
        if len(parts) < 2 or not parts[0]:
            raise ValueError(f"fault {text!r}: expected tool:kind[:on_call[:times]]")
        return cls(parts[0], parts[1], *(int(p) for p in parts[2:4]))

    def as_dict(self) -> dict[str, str | int]:
        """The plan as JSON (``from_dict`` reads it back)."""
        return {"tool": self.tool, "kind": self.kind, "on_call": self.on_call, "times": self.times}

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> FaultPlan | None:
        """A plan from its JSON (``as_dict``), or None for none."""
        if not data:
            return None
        on_call, times = data.get("on_call", 1), data.get("times", 1)
        if not isinstance(on_call, int) or not isinstance(times, int):
            raise ValueError(f"fault plan {dict(data)!r}: on_call and times are whole numbers")
        return cls(str(data["tool"]), str(data.get("kind", "503")), on_call, times)


def trial_id_for(study: str, task_key: str, perturbation: str, variant: str, repeat: int) -> str:
    """The readable, deterministic id of one trial."""
    return f"{study}/{task_key}/{perturbation}/{variant}/k{repeat}"


@dataclass(frozen=True)
class TrialIdentity:
    """Which trial a run belongs to. Carried on spans, in baggage and in resource attributes."""

    trial_id: str
    perturbation: str = "baseline"
    variant: str = "0"
    study: str = "adhoc"
    repeat: int = 0
    task_key: str | None = None
    attempt: int = 1
    fault: FaultPlan | None = None
    instance: str = ""  # the study state's random id: the same trial of two states never shares a trace
    nonce: str = ""  # minted by the driver per attempt (`at_attempt`): the attempt's trace cannot be guessed

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ValueError("a trial attempt is numbered from 1")

    def at_attempt(self, attempt: int, nonce: str | None = None) -> TrialIdentity:
        """The same trial, execution number ``attempt``, with a trace of its own that no one can compute
        beforehand (a fresh random nonce unless one is given)."""
        return replace(self, attempt=attempt, nonce=secrets.token_hex(16) if nonce is None else nonce)

    def attributes(self) -> dict[str, str | int]:
        """Span / resource attributes (``plumbline.*``), fault evidence included on a faulted trial."""
        attrs: dict[str, str | int] = {
            TRIAL_ID: self.trial_id,
            TRIAL_ATTEMPT: self.attempt,
            PERTURBATION: self.perturbation,
            VARIANT: self.variant,
            STUDY: self.study,
            REPEAT: self.repeat,
        }
        if self.instance:
            attrs[INSTANCE] = self.instance
        if self.task_key is not None:
            attrs[TASK_KEY] = self.task_key
        if self.fault is not None:
            attrs.update(self.fault.attributes())
        return attrs

    def as_dict(self) -> dict[str, str | int | None]:
        """The identity as JSON (the HTTP adapter's ``trial``)."""
        return {"trial_id": self.trial_id, "attempt": self.attempt, "perturbation": self.perturbation,
                "variant": self.variant, "study": self.study, "repeat": self.repeat, "task_key": self.task_key,
                "instance": self.instance}

    # --- the attempt's trace ----------------------------------------------------------------

    def _digest(self) -> str:
        return hashlib.sha256(f"plumbline.replay:{self.instance}:{self.trial_id}#{self.attempt}:{self.nonce}".encode()).hexdigest()

    @property
    def trace_id(self) -> str:
        """32 hex digits, one trace per attempt of this trial (never all zero)."""
        value = self._digest()[:32]
        return value if int(value, 16) else "1".rjust(32, "0")

    @property
    def parent_span_id(self) -> str:
        """16 hex digits: the attempt's virtual root, parent of the agent's root span."""
        value = self._digest()[32:48]
        return value if int(value, 16) else "1".rjust(16, "0")

    def traceparent(self) -> str:
        """W3C ``traceparent`` (sampled) pointing at the trial's virtual root."""
        return f"00-{self.trace_id}-{self.parent_span_id}-01"

    # --- carriers for agents in other processes ----------------------------------------------

    def baggage(self, extra: Mapping[str, object] | None = None) -> str:
        """W3C ``baggage`` header value: ``key=value`` pairs, values percent-encoded."""
        items = {**self.attributes(), **(extra or {})}
        return ",".join(f"{k}={_encode(v)}" for k, v in items.items() if v is not None)

    def resource_attributes(self, existing: str | None = None) -> str:
        """``OTEL_RESOURCE_ATTRIBUTES``: the caller's own pairs first, then this trial's (which win)."""
        ours = ",".join(f"{k}={_encode(v)}" for k, v in self.attributes().items())
        mine = {k for k in self.attributes()}
        kept = [p for p in (existing or "").split(",") if p.strip() and p.split("=", 1)[0].strip() not in mine]
        return ",".join([*kept, ours])


def _encode(value: object) -> str:
    return quote(str(value), safe="/:@-._~")
