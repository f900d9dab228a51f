"""plumbline_otel: agent trajectories, coverage, invariants and certificates from OpenTelemetry traces."""

from plumbline_otel import _native

_native.choose()  # before any compiled module is imported: a stale build runs its Python source

from plumbline_otel.errors import (  # noqa: E402
    ConfigError,
    InputError,
    MalformedRequest,
    MalformedTraceFile,
    PlumblineError,
    ReplayError,
    SpecError,
    StoreError,
)
from plumbline_otel.model import SpanRecord, Step, ToolCallRef, ToolResultRef, Trajectory  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "InputError",
    "MalformedRequest",
    "MalformedTraceFile",
    "PlumblineError",
    "ReplayError",
    "SpanRecord",
    "SpecError",
    "Step",
    "StoreError",
    "ToolCallRef",
    "ToolResultRef",
    "Trajectory",
    "__version__",
]
