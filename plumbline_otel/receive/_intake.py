"""What both transports do with an export request, once they have its bytes: the shared core.

`Intake.traces` admits the bytes into the queue, decodes them (with span salvage), queues the
decoded request and waits until the shards have applied the content rules and normalised it and
the writer has committed its spans. It answers with an `Outcome` that each transport maps to its
own status codes in one place (`_grpc.py`, `_http.py`). Logs take a shorter path: decoded, filtered
to gen_ai.* events and written by the commit thread in one call.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from plumbline_otel.content import ContentFilter
from plumbline_otel.decode import BodyTooLarge, Problem, decode_logs, decode_request_body, inflate
from plumbline_otel.errors import MalformedRequest, StoreError
from plumbline_otel.normalise import log_rows
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.receive._writer import Overloaded, WriteQueue

log = logging.getLogger("plumbline.receive")

Status = Literal["ok", "partial", "invalid", "too_large", "overloaded", "unavailable"]
_MAX_MESSAGE = 4096  # error_message stays far below the 4 MiB response cap


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

    def traces(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int) -> Outcome:
        """Store the spans of one export request; answer only once they are committed."""
        started = time.perf_counter()
        outcome = self._traces(data, content_type, encoding, transport, limit)
        self._count(transport, "traces", outcome, started)
        return outcome

    def logs(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int) -> Outcome:
        """Store the gen_ai.* log records of one export request."""
        started = time.perf_counter()
        outcome = self._logs(data, content_type, encoding, limit)
        self._count(transport, "logs", outcome, started)
        return outcome

    def _count(self, transport: str, signal: str, outcome: Outcome, started: float) -> None:
        self.metrics.inc("plumbline_requests_total", transport=transport, signal=signal, outcome=outcome.status)
        if outcome.status == "overloaded":
            self.metrics.inc("plumbline_pushback_total", transport=transport)
        self.metrics.observe(time.perf_counter() - started, transport=transport, signal=signal)

    def _traces(self, data: bytes, content_type: str, encoding: str, transport: str, limit: int) -> Outcome:
        nbytes = len(data)
        try:
            self.queue.admit(nbytes)
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        try:
            decoded = decode_request_body(data, content_type, encoding, limit, where=f"{transport} request")
        except BodyTooLarge as exc:
            self.queue.release(nbytes)
            return Outcome("too_large", str(exc))
        except MalformedRequest as exc:
            self.queue.release(nbytes)
            return Outcome("invalid", str(exc))
        del data
        spans = sum(len(ss.spans) for rs in decoded.request.resource_spans for ss in rs.scope_spans)
        if not spans and not decoded.problems:
            self.queue.release(nbytes)
            return Outcome("ok")
        try:
            ticket = self.queue.submit(nbytes, decoded, spans)
        except Overloaded as exc:
            self.metrics.inc("plumbline_spans_pushed_back_total", spans)
            return Outcome("overloaded", str(exc))
        del decoded  # the queue holds the request's bytes: its decoded form goes while the request waits
        self.metrics.inc("plumbline_spans_accepted_total", spans)
        try:
            problems, rejected = ticket.wait(self.commit_timeout)
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        except (StoreError, TimeoutError) as exc:
            return Outcome("unavailable", str(exc))
        except Exception as exc:  # normalising this request failed: a bug costs one request, never the server
            return Outcome("invalid", f"request could not be processed: {exc}")
        if problems:
            return Outcome("partial", _problem_text(problems, rejected), rejected)
        return Outcome("ok")

    def _logs(self, data: bytes, content_type: str, encoding: str, limit: int) -> Outcome:
        nbytes = len(data)
        try:
            self.queue.admit(nbytes)
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        try:
            request = decode_logs(inflate(data, encoding, limit), content_type)
            self.content.apply_logs(request)
            rows = log_rows(request)
            del request, data
            self.metrics.inc("plumbline_log_records_received_total", rows.received)
            if rows.kept:
                stored = self.queue.call(lambda store: store.write_logs(rows), self.commit_timeout)
                self.metrics.inc("plumbline_log_records_stored_total", stored)
        except BodyTooLarge as exc:
            return Outcome("too_large", str(exc))
        except MalformedRequest as exc:
            return Outcome("invalid", str(exc))
        except Overloaded as exc:
            return Outcome("overloaded", str(exc))
        except Exception as exc:
            log.exception("storing a logs request failed")
            return Outcome("unavailable", f"the store could not commit: {exc}")
        finally:
            self.queue.release(nbytes)
        return Outcome("ok")


__all__ = ["Intake", "Outcome"]
