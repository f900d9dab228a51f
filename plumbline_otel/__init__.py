"""plumbline_otel: agent trajectories, coverage, invariants and certificates from OpenTelemetry traces."""

import os

# numpy's OpenBLAS starts a thread per core at import, and they spin for ~0.1 s of CPU: in every
# `plumbline` command, and in each shard worker, where it took CPU from the ingest beside it.
# Nothing here multiplies matrices. A value the user set is kept; spawned workers inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from plumbline_otel import _native  # noqa: E402

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
