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
    │   ├── AdapterError      an agent adapter failed (replay/adapters.py)
    │   │   └── TransientAdapterError  it never reached the agent: retried
    │   ├── AttemptInterrupted the runner was stopped during the attempt
    │   ├── BudgetExceeded    the spend cap refused a call or a trial (replay/budget.py)
    │   ├── StudyLocked       another runner holds the study (replay/lock.py)
    │   └── LeaseLost         a shared study's claim went to another runner (replay/pgstate.py)
    ├── Overloaded            the receiver pushes back (receive/): RESOURCE_EXHAUSTED / 429
    └── EmitError             evaluation events could not be sent (evaluation_events.py)

Each subclass lives beside the code that raises it; this tree is the map.
The core raises these; the CLI and the receivers turn them into messages and status codes in one
place each (cli/main.py, receive/).
"""

from __future__ import annotations


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
