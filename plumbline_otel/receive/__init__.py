"""Receive: plumbline as an OTLP exporter target (gRPC :4317, HTTP :4318), durable and bounded.

    collector / SDK exporter ──► transport (_grpc, _http) ──► Intake (decode) ──► WriteQueue
    (bounded; shard processes apply content rules, normalise, assemble) ──► Store (one writer thread)

A request is answered success only after the transaction holding its spans committed; a retried
span is recognised by the store and stored once; a full queue answers with OTLP pushback
(UNAVAILABLE + RetryInfo, HTTP 503 + Retry-After). `plumbline_otel.service` wires these into `plumbline serve`.
"""

from plumbline_otel.content import ContentFilter
from plumbline_otel.receive._budget import Deadlines, MemoryBudget
from plumbline_otel.receive._grpc import GrpcLimits, GrpcReceiver
from plumbline_otel.receive._http import HttpServer, make_ssl_context
from plumbline_otel.receive._intake import Intake, Outcome
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.receive._standing import StandingCheck
from plumbline_otel.receive._writer import Overloaded, WriteQueue

__all__ = ["ContentFilter", "Deadlines", "GrpcLimits", "GrpcReceiver", "HttpServer", "Intake", "MemoryBudget", "Metrics", "Outcome", "Overloaded", "StandingCheck", "WriteQueue",
           "make_ssl_context"]
