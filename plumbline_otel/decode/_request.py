"""A transport body (OTLP/HTTP or gRPC) with its content type and encoding, decoded."""

from __future__ import annotations

import zlib

from plumbline_otel.decode._json import parse_json, request_from_json
from plumbline_otel.decode._json_wire import fast_request
from plumbline_otel.decode._problems import Decoded
from plumbline_otel.decode._proto import request_from_protobuf
from plumbline_otel.errors import InputError, MalformedRequest


class BodyTooLarge(InputError):
    """The body is larger than the configured limit after decompression (HTTP 413)."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding (gzip, deflate/zlib), refusing output past `limit` bytes (a gzip bomb is 413, not OOM)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        data = body
    elif encoding in ("gzip", "deflate", "zlib"):
        wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)
        try:
            data = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise MalformedRequest(f"body is not valid {encoding} data: {exc}") from None
    else:
        raise MalformedRequest(f"unsupported Content-Encoding {encoding!r} (use gzip, deflate or none)")
    if len(data) > limit:
        raise BodyTooLarge(f"body is larger than the {limit // (1 << 20)} MiB limit after decompression")
    return data


def is_json(content_type: str) -> bool:
    """OTLP/HTTP chooses JSON or protobuf by media type; parameters like charset are ignored."""
    return content_type.split(";")[0].strip().lower() == "application/json"


def decode_request_body(body: bytes, content_type: str, encoding: str = "", limit: int = 64 << 20, where: str = "request") -> Decoded:
    """Decode one export request body; raise MalformedRequest when nothing in it is usable."""
    data = inflate(body, encoding, limit)
    request = fast_request(data) if is_json(content_type) else None  # a well-formed JSON request: protobuf bytes, parsed in C
    if request is not None:
        decoded = Decoded(request, where)
    elif is_json(content_type):
        doc, repaired = parse_json(data, where)  # as a file's line: damage costs what it touches, not the request
        decoded = request_from_json(doc, where)
        del doc
        decoded.problems.extend(repaired)
    else:
        decoded = request_from_protobuf(data, where)
    if decoded.problems and not decoded.request.resource_spans:
        raise MalformedRequest("; ".join(str(p) for p in decoded.problems[:3]))
    return decoded


__all__ = ["BodyTooLarge", "decode_request_body", "inflate", "is_json"]
