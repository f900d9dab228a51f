"""Trace files: OTLP protobuf, OTLP JSON, OTLP JSON lines, each optionally gzipped; the format is
read from the content, not the name.

JSON lines (what the Collector's file exporter writes) and length-prefixed protobuf streams (its
`proto` format: a 4-byte big-endian size before each request) are read one request at a time, so
memory does not grow with the file. A single JSON document or protobuf message is one request and
is read whole.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.decode._json import SpanFilter, parse_json, request_from_json
from plumbline_otel.decode._json_wire import fast_request
from plumbline_otel.decode._logs import is_logs_document, logs_from_json, logs_from_protobuf
from plumbline_otel.decode._problems import Decoded
from plumbline_otel.decode._proto import request_from_protobuf
from plumbline_otel.errors import MalformedRequest, MalformedTraceFile, Problem

_GZIP_MAGIC = b"\x1f\x8b"
_JSON_START = (b"{", b"[")


def iter_trace_files(paths: list[str]) -> Iterator[Path]:
    """Expand files, directories (recursively, sorted) and glob patterns; unknown paths raise."""
    for raw in paths:
        if os.path.isdir(raw):
            yield from sorted(p for p in Path(raw).rglob("*") if p.is_file() and not p.name.startswith("."))
        elif os.path.exists(raw):
            yield Path(raw)
        else:
            matches = sorted(glob.glob(raw, recursive=True))
            if not matches:
                raise MalformedTraceFile(raw, "no such file, directory or glob match")
            yield from (Path(m) for m in matches if os.path.isfile(m))


def input_size(path: Path) -> int:
    """The bytes a trace file holds once decompressed (what reading it takes), for a progress line.

    A gzip file's trailer records its uncompressed size modulo 4 GiB (what `gzip -l` prints), so a
    larger one reads as the larger of that and its compressed size: an estimate, never an error.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            if size < 18 or file.read(2) != _GZIP_MAGIC:
                return size
            file.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(file.read(4), "little"))
    except OSError:
        return 0


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is a binary stream
    return open(path, "rb")


def _parse_json_line(line: bytes, where: str, keep: SpanFilter | None = None) -> Decoded:
    request = fast_request(line, keep)  # a well-formed trace request: straight to protobuf bytes, parsed in C
    if request is not None:
        return Decoded(request, where)
    try:
        doc, repaired = parse_json(line, where)  # invalid UTF-8, runaway nesting, numbers out of range: only what they touch is lost
    except MalformedRequest as exc:
        return Decoded(ExportTraceServiceRequest(), where, [Problem(where, str(exc).removeprefix(f"{where}: "))])
    decoded = _from_json(doc, where, keep)
    decoded.problems.extend(repaired)
    return decoded


def _from_json(doc: object, where: str, keep: SpanFilter | None) -> Decoded:
    """A trace request, or a logs request (a collector writes both signals as JSON lines) beside an empty trace request."""
    if not is_logs_document(doc):
        return request_from_json(doc, where, keep)
    try:
        return Decoded(ExportTraceServiceRequest(), where, logs=logs_from_json(doc))
    except MalformedRequest as exc:
        return Decoded(ExportTraceServiceRequest(), where, [Problem(where, str(exc))])


@dataclass(frozen=True)
class Unit:
    """One request's raw bytes from a file, not yet decoded: the piece of work a worker process takes."""

    kind: Literal["json", "protobuf", "truncated"]
    data: bytes
    where: str


def decode_unit(unit: Unit, keep: SpanFilter | None = None) -> Decoded:
    """Decode one unit; damage comes back as problems.

    `keep`, given a span's raw JSON trace id, says whether to decode that span at all: a shard
    skips the (costly) mapping of JSON spans it does not own. Protobuf spans are all decoded (the
    C parser makes that cheap); the caller filters them.
    """
    if unit.kind == "json":
        return _parse_json_line(unit.data, unit.where, keep)
    if unit.kind == "truncated" and not unit.data:
        return Decoded(ExportTraceServiceRequest(), unit.where, [Problem(unit.where, "file ends inside a length prefix")])
    decoded = request_from_protobuf(unit.data, unit.where)
    if not _has_spans(decoded):  # perhaps a logs request: the Collector's `proto` file format writes both signals
        logs = logs_from_protobuf(unit.data)
        if logs is not None:
            return Decoded(ExportTraceServiceRequest(), unit.where, logs=logs)
    return decoded


def _has_spans(decoded: Decoded) -> bool:
    return any(span.trace_id for rs in decoded.request.resource_spans for ss in rs.scope_spans for span in ss.spans)


def _json_units(stream: IO[bytes], path: Path) -> Iterator[Unit]:
    first = stream.readline()
    while first and not first.strip():
        first = stream.readline()
    try:
        parse_json(first, "")  # a damaged first line is still a line (its damage costs what it touches)
    except MalformedRequest:  # a single (pretty-printed) JSON document
        yield Unit("json", first + stream.read(), str(path))
        return
    yield Unit("json", first, f"{path}:1")
    for number, line in enumerate(stream, start=2):
        if line.strip():
            yield Unit("json", line, f"{path}:{number}")


def _length_prefixed_units(stream: IO[bytes], path: Path) -> Iterator[Unit]:
    number = 0
    while header := stream.read(4):
        number += 1
        where = f"{path} message {number}"
        size = int.from_bytes(header, "big")
        payload = stream.read(size)
        if len(header) < 4 or len(payload) < size:
            yield Unit("truncated", payload, where + " (truncated)")
            return
        yield Unit("protobuf", payload, where)


def iter_units(path: Path) -> Iterator[Unit]:
    """The requests in one trace file as raw units, read one at a time.

    A damaged gzip stream (truncated, or corrupt part-way) raises `MalformedTraceFile` after the
    units that decompressed before the damage: those are kept.
    """
    try:
        stream = _open(path)
    except OSError as exc:
        raise MalformedTraceFile(str(path), f"cannot open: {exc.strerror or exc}") from None
    with stream:
        try:
            yield from _units(stream, path)
        except EOFError:
            raise MalformedTraceFile(str(path), "the gzip stream is truncated; what decompressed before the cut was kept") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise MalformedTraceFile(str(path), f"the gzip stream is corrupt ({exc}); what decompressed before it was kept") from None


def _units(stream: IO[bytes], path: Path) -> Iterator[Unit]:
    try:
        head = stream.peek(256)[:256]  # type: ignore[attr-defined]
    except OSError as exc:
        raise MalformedTraceFile(str(path), f"unreadable: {exc}") from None
    if not head:
        return
    if _looks_like_json(head):
        if head[:1] != b"\n":
            yield from _json_units(stream, path)
            return
        data = stream.read()  # "\n" also starts a protobuf request: let the content decide
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            yield Unit("protobuf", data, str(path))
            return
        yield from _json_units(io.BytesIO(data), path)
    elif head[:1] == b"\x00":
        yield from _length_prefixed_units(stream, path)
    else:
        yield Unit("protobuf", stream.read(), str(path))


def read_trace_file(path: Path) -> Iterator[Decoded]:
    """Yield the requests in one trace file; damaged parts come back as problems, never exceptions."""
    return map(decode_unit, iter_units(path))


def _looks_like_json(head: bytes) -> bool:
    """JSON starts with `{` or `[` after optional whitespace; a protobuf request starts with 0x0A."""
    stripped = head.lstrip(b" \t\r\n")
    if stripped[:1] not in _JSON_START:
        return False
    after = stripped[1:].lstrip(b" \t\r\n")[:1]
    return after in (b'"', b"}", b"{", b"[", b"]", b"") or stripped[:1] == b"["
