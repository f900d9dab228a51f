"""One exception tree for the whole service; every error says *where*.

    PlumblineError
    ├── InputError            something a user gave us is wrong; fix the input and retry
    │   ├── MalformedRequest  an OTLP request body (transport or file content) that cannot be decoded
    │   ├── BodyTooLarge      a request body over the receiver's limit (decode/)
    │   ├── MalformedTraceFile a trace file, with the file and line
    │   ├── ConfigError       a config file or flag, with the key
    │   ├── SpecError         an invariant spec, with the file, line and reason
    │   └── CertificateError  a certificate file the gate cannot read (report/render.py)
    ├── StoreError            the DuckDB store (locked by a server, unreadable, wrong version)
    │   └── StoreLocked       held by another process, named (store/)
    ├── ReplayError           the replay driver or an agent adapter
    │   ├── AdapterError      an agent adapter failed (replay/)
    │   │   └── TransientAdapterError  it never reached the agent: retried
    │   ├── AttemptInterrupted the runner was stopped during the attempt
    │   ├── BudgetExceeded    the spend cap refused a call or a trial (replay/budget.py)
    │   ├── StudyLocked       another runner holds the study (replay/lock.py)
    │   └── LeaseLost         a shared study's claim went to another runner (replay/pgstate.py)
    ├── Overloaded            the receiver pushes back (receive/): RESOURCE_EXHAUSTED / 429
    │   └── OverBudget        the memory budget for bytes in flight is spent (receive/_writer.py)
    └── EmitError             evaluation events could not be sent (evaluation_events.py)

Each subclass lives beside the code that raises it; this tree is the map.
The core raises these; the CLI and the receivers turn them into messages and status codes in one
place each (cli/main.py, receive/).

What is rejected *without* raising is a `Problem`: the same where and reason, as a value, so a bad
line, span or attribute is reported and everything beside it is kept. Decoding, normalisation, the
pipeline, the receiver and the store all record them; it lives here, in the core, so none of them
imports another stage for it (`decode` still re-exports it for `normalise`, its last importer there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """Something in the input that was rejected; `where` is a file:line, a span id or a field path."""

    where: str
    reason: str
    spans: int = 0  # how many spans this problem cost (0 when only an attribute or a whole unknown blob)

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class PlumblineError(Exception):
    """Base of every error plumbline_otel raises on purpose."""


class InputError(PlumblineError):
    """Input from a user or a peer was wrong; the message says what and where."""


class MalformedRequest(InputError):
    """An OTLP export request that cannot be decoded at all."""


class MalformedTraceFile(InputError):
    """A trace file (or one line of it) that cannot be decoded."""

    def __init__(self, path: str, reason: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class ConfigError(InputError):
    """A configuration value is wrong; names the key."""


class SpecError(InputError):
    """An invariant spec is wrong; names the file, line and reason."""


class StoreError(PlumblineError):
    """The store cannot be opened, read or written."""


class ReplayError(PlumblineError):
    """The replay driver or an agent adapter failed."""
