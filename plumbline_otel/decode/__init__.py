"""Decode: bytes from a transport or a file become `ExportTraceServiceRequest` messages.

Every way in shares this one representation, so one normaliser serves them all. Problems are
values (`Problem`: the core's `errors.Problem`, re-exported here), never exceptions that lose the
rest of the input: a bad line, a truncated message or a span with a malformed id is reported with
where it was, and everything decodable beside it is kept.
"""

from plumbline_otel.decode._files import Unit, decode_unit, input_size, iter_trace_files, iter_units, read_trace_file
from plumbline_otel.decode._json import request_from_json
from plumbline_otel.decode._logs import decode_logs
from plumbline_otel.decode._problems import Decoded
from plumbline_otel.decode._proto import request_from_protobuf
from plumbline_otel.decode._request import BodyTooLarge, decode_request_body, inflate, is_json
from plumbline_otel.errors import Problem

__all__ = [
    "BodyTooLarge",
    "inflate",
    "is_json",
    "Decoded",
    "Problem",
    "Unit",
    "decode_logs",
    "decode_request_body",
    "decode_unit",
    "input_size",
    "iter_trace_files",
    "iter_units",
    "read_trace_file",
    "request_from_json",
    "request_from_protobuf",
]
