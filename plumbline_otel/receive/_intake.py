"""What both transports do with an export request, once they have its bytes: the shared core.

`Intake.traces` admits the bytes into the queue, decodes them (with span salvage), queues the
decoded request and waits until the shards have applied the content rules and normalised it and
the writer has committed its spans. It answers with an `Outcome` that each transport maps to its
own status codes in one place (`_grpc.py`, `_http.py`). Logs take a shorter path: decoded, filtered
to gen_ai.* events and written by the commit thread in one call.

Answering: a request is answered with the real outcome of its commit, not a guess. It waits at
least `commit_timeout` plus its share of the queue (the spans waiting when it was queued, its own
included) at `COMMIT_FLOOR` spans a second, far below any measured rate, and beyond that for as long
as the pipeline keeps moving (a part handed over or committed within `commit_timeout`); only a
pipeline stalled past both is answered 503 "did not commit in time". Before (issue 43), a fixed 30 s
answered a 200,000-span OTLP JSON request 503 under load though every span was committed, and a
client that believed it sent them all again (stored once: the writer drops spans it already holds).

Memory: a request arrives holding the bytes its transport reserved while reading it (`held`) and
keeps a charge in the server's `MemoryBudget` all the way: each piece of an inflated body before it
is kept, `DECODE_FACTOR` times the body while it is decoded (a parsed request takes about twice its
protobuf size; JSON more), then the queued protobuf bytes until the commit. Past the budget the
answer is "exhausted": pushback, retryable.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Literal

from plumbline_otel.content import ContentFilter
from plumbline_otel.decode import BodyTooLarge, decode_logs, decode_request_body
from plumbline_otel.errors import MalformedRequest, Problem, StoreError
from plumbline_otel.normalise import log_rows
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.receive._writer import OverBudget, Overloaded, Prepared, Ticket, WriteQueue

log = logging.getLogger("plumbline.receive")

Status = Literal["ok", "partial", "invalid", "too_large", "overloaded", "exhausted", "unavailable"]
_MAX_MESSAGE = 4096  # error_message stays far below the 4 MiB response cap
# Bytes charged per body byte while it is decoded: the body itself and the parsed request (measured:
# a 15 MiB protobuf request of agent spans parses into ~29 MiB, a 10 MiB JSON one into ~20 MiB, which
# is then encoded as protobuf for the queue).
DECODE_FACTOR = {"protobuf": 3, "json": 4}
_INFLATE_PIECE = 1 << 20  # an inflated body is charged a piece at a time
COMMIT_FLOOR = 200  # spans a second the commit deadline allows for: ~30x below the slowest rate measured (issue 43)
_WAIT_SLICE = 0.5  # how often a waiting request looks whether the pipeline moved


class _Charge:
    """A request's bytes in the budget, from the transport's reservation to the queue (or back)."""

    def __init__(self, queue: WriteQueue, held: int) -> None:
        self.queue, self.nbytes = queue, held

    def to(self, nbytes: int) -> None:
        """Hold `nbytes` now; `OverBudget` (holding nothing) when they do not fit."""
        held, self.nbytes = self.nbytes, 0
        self.queue.admit(nbytes, held)
        self.nbytes = nbytes

    def hand_over(self) -> int:
        nbytes, self.nbytes = self.nbytes, 0
        return nbytes

    def free(self) -> None:
        self.queue.release(self.hand_over())


def _inflate(body: bytes, encoding: str, limit: int, charge: _Charge) -> bytes:
    """Undo Content-Encoding a piece at a time, each piece charged before it is kept; 413 past `limit`."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate", "zlib"):
        raise MalformedRequest(f"unsupported Content-Encoding {encoding!r} (use gzip, deflate or none)")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    pieces: list[bytes] = []
    total, pending = 0, body
    try:
        while pending or not inflater.eof:
            piece = inflater.decompress(pending, _INFLATE_PIECE)
            pending = inflater.unconsumed_tail
            if not piece:
                break
            total += len(piece)
            if total > limit:
                raise BodyTooLarge(f"body is larger than the {limit // (1 << 20)} MiB limit after decompression")
            charge.to(charge.nbytes + len(piece))
            pieces.append(piece)
    except zlib.error as exc:
        raise MalformedRequest(f"body is not valid {encoding} data: {exc}") from None
    charge.to(charge.nbytes + total)  # the joined copy, while the pieces still exist
    data = b"".join(pieces)
    pieces.clear()
    charge.to(charge.nbytes - total)
    return data


@dataclass(frozen=True)
class Outcome:
    """How a request ended: `rejected` counts unusable items when status is "partial"."""

    status: Status
    message: str = ""
    rejected: int = 0


def _problem_text(problems: list[Problem], rejected: int) -> str:
    shown = "; ".join(str(p) for p in problems[:5])
    more = f" (and {len(problems) - 5} more problems)" if len(problems) > 5 else ""
    head = f"{rejected} span(s) rejected: " if rejected else ""
    return (head + shown + more)[:_MAX_MESSAGE]


class Intake:
    """Transport-neutral request handling; thread-safe, one instance per server."""

    def __init__(self, queue: WriteQueue, metrics: Metrics, content: ContentFilter, *, commit_timeout: float = 30.0) -> None:
        self.queue, self.metrics, self.content = queue, metrics, content
        self.commit_timeout = commit_timeout

    def traces(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int, held: int = 0) -> Outcome:
        """Store the spans of one export request; answer only once they are committed.

        `held` bytes of the memory budget, reserved by the transport while reading, pass to this
        request (and are given back, whatever happens); with 0 its bytes are reserved here.
        """
        started = time.perf_counter()
        charge = _Charge(self.queue, held)
        try:
            outcome = self._traces(data, content_type, encoding, transport, limit, charge)
        finally:
            charge.free()
        self._count(transport, "traces", outcome, started)
        return outcome

    def logs(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int, held: int = 0) -> Outcome:
        """Store the gen_ai.* log records of one export request (`held` as for `traces`)."""
        started = time.perf_counter()
        charge = _Charge(self.queue, held)
        try:
            outcome = self._logs(data, content_type, encoding, limit, charge)
        finally:
            charge.free()
        self._count(transport, "logs", outcome, started)
        return outcome

    def _count(self, transport: str, signal: str, outcome: Outcome, started: float) -> None:
        self.metrics.inc("plumbline_requests_total", transport=transport, signal=signal, outcome=outcome.status)
        if outcome.status in ("overloaded", "exhausted"):
            self.metrics.inc("plumbline_pushback_total", transport=transport)
        self.metrics.observe(time.perf_counter() - started, transport=transport, signal=signal)

    def _traces(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int, charge: _Charge) -> Outcome:
        kind = "json" if content_type == "application/json" else "protobuf"
        try:
            charge.to(len(data))
            body = _inflate(data, encoding, limit, charge)
            del data  # the wire bytes go (when compressed; else they are the body)
            charge.to(DECODE_FACTOR[kind] * len(body))
            decoded = decode_request_body(body, content_type, "", limit, where=f"{transport} request")
        except OverBudget as exc:
            return Outcome("exhausted", str(exc))
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        except BodyTooLarge as exc:
            return Outcome("too_large", str(exc))
        except MalformedRequest as exc:
            return Outcome("invalid", str(exc))
        del body
        spans = sum(len(ss.spans) for rs in decoded.request.resource_spans for ss in rs.scope_spans)
        if not spans and not decoded.problems:
            return Outcome("ok")
        try:
            ticket = self.queue.submit(charge.hand_over(), decoded, spans)
        except Overloaded as exc:
            self.metrics.inc("plumbline_spans_pushed_back_total", spans)
            return Outcome("overloaded", str(exc))
        del decoded  # the queue holds the request's bytes: its decoded form goes while the request waits
        self.metrics.inc("plumbline_spans_accepted_total", spans)
        try:
            problems, rejected = self._committed(ticket)
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        except (StoreError, TimeoutError) as exc:
            return Outcome("unavailable", str(exc))
        except Exception as exc:  # normalising this request failed: a bug costs one request, never the server
            return Outcome("invalid", f"request could not be processed: {exc}")
        if problems:
            return Outcome("partial", _problem_text(problems, rejected), rejected)
        return Outcome("ok")

    def _committed(self, ticket: Ticket) -> Prepared:
        """Wait for the request's commit (see the module docstring); `TimeoutError` only once the pipeline stalled."""
        started = time.monotonic()
        allowance = self.commit_timeout + self.queue.depth[0] / COMMIT_FLOOR
        seen, moved = self.queue.progress, started
        while not ticket.done.wait(_WAIT_SLICE):
            now = time.monotonic()
            if self.queue.progress != seen:
                seen, moved = self.queue.progress, now
            elif now - started > allowance and now - moved > self.commit_timeout:
                break
        result: Prepared = ticket.wait(0)
        return result

    def _logs(self, data: bytes, content_type: str, encoding: str, limit: int, charge: _Charge) -> Outcome:
        kind = "json" if content_type == "application/json" else "protobuf"
        try:
            charge.to(len(data))
            body = _inflate(data, encoding, limit, charge)
            del data
            charge.to(DECODE_FACTOR[kind] * len(body))
            request = decode_logs(body, content_type)
            del body
            self.content.apply_logs(request)
            rows = log_rows(request)
            del request
            self.metrics.inc("plumbline_log_records_received_total", rows.received)
            if rows.kept:
                stored = self.queue.call(lambda store: store.write_logs(rows), self.commit_timeout)
                self.metrics.inc("plumbline_log_records_stored_total", stored)
        except BodyTooLarge as exc:
            return Outcome("too_large", str(exc))
        except MalformedRequest as exc:
            return Outcome("invalid", str(exc))
        except OverBudget as exc:
            return Outcome("exhausted", str(exc))
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        except Exception as exc:
            log.exception("storing a logs request failed")
            return Outcome("unavailable", f"the store could not commit: {exc}")
        return Outcome("ok")


__all__ = ["COMMIT_FLOOR", "DECODE_FACTOR", "Intake", "Outcome"]
