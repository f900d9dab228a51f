"""The server side of plumbline.v1.Plumbline; every read runs on the writer thread's connection."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson

from plumbline_otel import __version__
from plumbline_otel.api import plumbline_pb2 as pb
from plumbline_otel.api import plumbline_pb2_grpc as pb_grpc
from plumbline_otel.coverage import coverage_report
from plumbline_otel.receive import Metrics, Overloaded, WriteQueue
from plumbline_otel.store import CertificateRow, Store

log = logging.getLogger("plumbline.api")

DEFAULT_PAGE = 500
_MAX_PAGE = 5000


def _page(store: Store, state: dict[str, Any], request: pb.ListTrajectoriesRequest, size: int) -> list[str]:
    """The next page of the listing; the generator lives between calls on the writer thread only."""
    if "rows" not in state:
        if request.assemble_first:
            store.assemble()
        state["rows"] = store.trajectories(
            service=request.service if request.HasField("service") else None,
            task=request.task if request.HasField("task") else None,
            since_ns=request.since_ns if request.HasField("since_ns") else None,
        )
    page: list[str] = []
    for trajectory in state["rows"]:
        page.append(orjson.dumps(trajectory.export(), default=str).decode())
        if len(page) >= size:
            break
    return page


def _coverage(store: Store, request: pb.CoverageRequest) -> str:
    if request.assemble_first:
        store.assemble()
    since = request.since_ns if request.HasField("since_ns") else None
    if request.counts:
        report = store.coverage_counts(since_ns=since, exclude_traces=list(request.exclude_trace_ids))
    else:
        report = coverage_report(store, since_ns=since)
    return orjson.dumps(report, default=str).decode()


def _store_check(store: Store, request: pb.StoreCheckRequest) -> int:
    """Replace the violations of the checked runs under the spec, and keep that they were checked (one writer-thread call)."""
    rows = [(v.invariant_id, v.trajectory_id, v.severity, v.task_key if v.HasField("task_key") else None,
             v.step_index if v.HasField("step_index") else None, v.step_name if v.HasField("step_name") else None, v.detail)
            for v in request.violations]
    checked = list(request.checked_trajectory_ids)
    written = store.write_violations(request.spec_hash, checked, rows)
    store.record_check(request.spec_hash, request.spec_name, request.spec_path, checked)
    return written


class PlumblineServicer(pb_grpc.PlumblineServicer):
    """Answers the API from the store the server is writing; `status` says SERVING or DRAINING."""

    def __init__(self, queue: WriteQueue, metrics: Metrics, db_path: str, status: Callable[[], str]) -> None:
        self._queue, self._metrics, self._db_path, self._status = queue, metrics, db_path, status

    def _read(self, fn: Callable[[Store], Any], context: grpc.ServicerContext) -> Any:
        try:
            return self._queue.call(fn)
        except Overloaded as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except TimeoutError as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))

    def ListTrajectories(self, request: pb.ListTrajectoriesRequest, context: grpc.ServicerContext) -> Iterator[pb.TrajectoryPage]:
        size = min(request.page_size or DEFAULT_PAGE, _MAX_PAGE)
        remaining = request.limit or None
        state: dict[str, Any] = {}
        try:
            while context.is_active():
                want = size if remaining is None else min(size, remaining)
                def read_page(store: Any, want: int = want) -> Any:
                    return _page(store, state, request, want)

                page = self._read(read_page, context)
                if page:
                    yield pb.TrajectoryPage(trajectory_json=page)
                if remaining is not None:
                    remaining -= len(page)
                if len(page) < want or remaining == 0:
                    return
        finally:
            if "rows" in state:  # close the cursor where it was opened
                try:
                    self._queue.call(lambda _store: state["rows"].close())
                except Exception:  # the stream is over either way; a cursor left open is closed with the store
                    log.warning("closing the trajectories cursor failed", exc_info=True)

    def Coverage(self, request: pb.CoverageRequest, context: grpc.ServicerContext) -> pb.CoverageResponse:
        return pb.CoverageResponse(report_json=self._read(lambda store: _coverage(store, request), context))

    def TraceIds(self, request: pb.TraceIdsRequest, context: grpc.ServicerContext) -> Iterator[pb.TraceIdPage]:
        ids = self._read(Store.trace_ids, context)
        size = min(request.page_size or 10 * _MAX_PAGE, 100 * _MAX_PAGE)
        for start in range(0, len(ids), size):
            yield pb.TraceIdPage(trace_id=ids[start:start + size])

    def StoreCheck(self, request: pb.StoreCheckRequest, context: grpc.ServicerContext) -> pb.StoreCheckResponse:
        if not request.spec_hash:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec_hash is required")
        checked = set(request.checked_trajectory_ids)
        stray = next((v.trajectory_id for v in request.violations if v.trajectory_id not in checked), None)
        if stray is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"violation of run {stray[:64]!r}, which is not among the checked runs")
        written = self._read(lambda store: _store_check(store, request), context)
        return pb.StoreCheckResponse(violations_written=written, runs_checked=len(checked))

    def StoreCertificate(self, request: pb.StoreCertificateRequest, context: grpc.ServicerContext) -> pb.StoreCertificateResponse:
        from plumbline_otel.report.model import CertificateFormatError, read_certificate

        try:
            cert = read_certificate(orjson.loads(request.certificate_json))
        except orjson.JSONDecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"certificate_json is not JSON: {exc}")
        except CertificateFormatError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a usable certificate: {exc}")
        head, filters = cert.headline, cert.provenance.filters
        row = CertificateRow(cert.spec.hash, filters.study, filters.agent, head.verdict, head.lower_bound)
        kept = self._read(lambda store: store.store_certificate(row, request.certificate_json), context)
        return pb.StoreCertificateResponse(certificates=kept)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        spans, nbytes = self._queue.depth
        get = self._metrics.get
        return pb.HealthResponse(
            status=self._status(), version=__version__, db_path=self._db_path,
            spans_received=int(get("plumbline_spans_received_total")), spans_stored=int(get("plumbline_spans_stored_total")),
            spans_duplicate=int(get("plumbline_spans_duplicate_total")), spans_rejected=int(get("plumbline_spans_rejected_total")),
            queue_spans=spans, queue_bytes=nbytes,
        )


def add_to_server(servicer: PlumblineServicer, server: grpc.Server) -> None:
    """Register the API on a gRPC server."""
    pb_grpc.add_PlumblineServicer_to_server(servicer, server)


__all__ = ["PlumblineServicer", "add_to_server"]
