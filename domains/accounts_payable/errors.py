"""Errors the accounts-payable tools raise; every message is written for the agent to read.

    DomainError              a call the system of record refuses: unknown tool or document,
    │                        missing or wrongly typed argument, an approver without authority
    └── TransientToolError   an injected infrastructure fault (503, 429, timeout, reset);
                             the same call may succeed when retried

A business finding (a vendor on hold, a price variance) is never an error: the check tools
report it in their result, so a trajectory shows the check as a successful call.
"""

from __future__ import annotations

TRANSIENT_KINDS: dict[str, str] = {
    "503": "503 Service Unavailable: the accounts payable service is temporarily unavailable",
    "429": "429 Too Many Requests: rate limit exceeded",
    "timeout": "timeout: the accounts payable service did not answer in time",
    "connection_reset": "connection reset by peer while calling the accounts payable service",
}


class DomainError(Exception):
    """A refused tool call; `str(error)` is the message the agent sees."""


class TransientToolError(DomainError):
    """An injected transient fault; `kind` is one of "503", "429", "timeout", "connection_reset"."""

    def __init__(self, kind: str, message: str | None = None) -> None:
        if kind not in TRANSIENT_KINDS:
            raise ValueError(f"unknown transient fault kind {kind!r}; expected one of {sorted(TRANSIENT_KINDS)}")
        super().__init__(message or f"{TRANSIENT_KINDS[kind]}; retry the call")
        self.kind = kind
