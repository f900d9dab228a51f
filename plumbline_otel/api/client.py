"""A small client for a running `plumbline serve`: trajectories and coverage without opening the file.

    with PlumblineClient("127.0.0.1:4317") as client:
        for doc in client.trajectories(service="billing-agent"):
            ...  # the `Trajectory.export()` dict; rows.trajectory_from_doc(doc) gives a Trajectory
        report = client.coverage()

Connection problems and server errors raise `StoreError` with the address and what the server said.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import orjson

from plumbline_otel.api import plumbline_pb2 as pb
from plumbline_otel.api import plumbline_pb2_grpc as pb_grpc
from plumbline_otel.config import TOKEN_ENV
from plumbline_otel.errors import StoreError


class PlumblineClient:
    """Reads from a running server over plumbline's gRPC API.

    Args:
        address: HOST:PORT of the server's gRPC port (the OTLP/gRPC port).
        token: bearer token when the server requires one; defaults to $PLUMBLINE_AUTH_TOKEN.
        tls: use TLS; `ca_file` is the PEM of the CA (or the self-signed cert) to trust.
        timeout: seconds allowed for each call.
    """

    def __init__(self, address: str, token: str | None = None, tls: bool = False, ca_file: str | None = None,
                 timeout: float = 60.0) -> None:
        self.address = address
        self.timeout = timeout
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if tls or ca_file:
            roots = Path(ca_file).read_bytes() if ca_file else None
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(roots), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.PlumblineStub(self._channel)

    def _error(self, exc: grpc.RpcError) -> StoreError:
        code = exc.code() if hasattr(exc, "code") else None
        name = code.name if code is not None else "ERROR"
        return StoreError(f"plumbline server at {self.address}: {name}: {exc.details() if hasattr(exc, 'details') else exc}")

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     limit: int | None = None, assemble_first: bool = True) -> Iterator[dict[str, Any]]:
        """Stored trajectories in start order, as `Trajectory.export()` dicts."""
        request = pb.ListTrajectoriesRequest(service=service, task=task, since_ns=since_ns, limit=limit or 0,
                                             assemble_first=assemble_first)
        try:
            for page in self._stub.ListTrajectories(request, timeout=self.timeout, metadata=self._metadata):
                for doc in page.trajectory_json:
                    yield orjson.loads(doc)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def coverage(self, since_ns: int | None = None, assemble_first: bool = True, counts: bool = False,
                 exclude_trace_ids: Sequence[str] = ()) -> dict[str, Any]:
        """The coverage report of the server's store (the dict `coverage_report` returns), or with
        `counts` the additive counts it is derived from (`coverage_counts`, without
        `exclude_trace_ids`), for summing stores."""
        request = pb.CoverageRequest(since_ns=since_ns, assemble_first=assemble_first, counts=counts,
                                     exclude_trace_ids=list(exclude_trace_ids))
        try:
            response = self._stub.Coverage(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        report: dict[str, Any] = orjson.loads(response.report_json)
        if counts and report.get("form") != "counts":
            raise StoreError(f"plumbline server at {self.address} is too old to give coverage counts; upgrade it to read several stores as one")
        return report

    def trace_ids(self) -> Iterator[str]:
        """The id of every trace the server has stored, sorted."""
        try:
            for page in self._stub.TraceIds(pb.TraceIdsRequest(), timeout=self.timeout, metadata=self._metadata):
                yield from page.trace_id
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StoreError(f"plumbline server at {self.address} is too old to list trace ids; upgrade it to read several stores as one") from None
            raise self._error(exc) from None

    def store_check(self, spec_hash: str, spec_name: str, spec_path: str, checked: Sequence[str],
                    rows: Sequence[tuple[Any, ...]]) -> int:
        """Keep on the server that `checked` runs were judged against the spec, with their violations (rows in
        `store.VIOLATION_COLUMNS` order), replacing what it held for those runs under that spec; returns the rows written."""
        violations = [pb.Violation(invariant_id=r[0], trajectory_id=r[1], severity=r[2], task_key=r[3], step_index=r[4],
                                   step_name=r[5], detail="" if r[6] is None else str(r[6])) for r in rows]
        request = pb.StoreCheckRequest(spec_hash=spec_hash, spec_name=spec_name, spec_path=spec_path,
                                       checked_trajectory_ids=list(checked), violations=violations)
        try:
            response = self._stub.StoreCheck(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StoreError(f"plumbline server at {self.address} is too old to keep violations; upgrade it") from None
            raise self._error(exc) from None
        return int(response.violations_written)

    def store_certificate(self, cert: dict[str, Any]) -> int:
        """Keep a certificate on the server (its console shows the latest); returns how many it keeps."""
        try:
            response = self._stub.StoreCertificate(pb.StoreCertificateRequest(certificate_json=orjson.dumps(cert).decode()),
                                                   timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StoreError(f"plumbline server at {self.address} is too old to keep certificates; upgrade it") from None
            raise self._error(exc) from None
        return int(response.certificates)

    def health(self) -> dict[str, Any]:
        """Status, version, ingest counters and queue depth."""
        try:
            response = self._stub.Health(pb.HealthRequest(), timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return {f.name: getattr(response, f.name) for f in response.DESCRIPTOR.fields}

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> PlumblineClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


__all__ = ["PlumblineClient"]
