"""The values decoding produces: a request, or a problem that says where (`errors.Problem`, the core's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.errors import Problem


@dataclass
class Decoded:
    """One decoded request with the problems met while decoding it (spans already dropped)."""

    request: ExportTraceServiceRequest
    where: str
    problems: list[Problem] = field(default_factory=list)
    logs: ExportLogsServiceRequest | None = None  # a logs request met in a file (its records belong to spans)
    # The protobuf bytes `request` was read from, when it was read whole: a receiver passes them on as
    # they came rather than encoding the request again.
    raw: bytes | None = None

    def protobuf(self) -> bytes:
        """The request as protobuf bytes: as received when it was read whole, else what could be read."""
        return self.raw if self.raw is not None else self.request.SerializeToString()


__all__ = ["Decoded"]
