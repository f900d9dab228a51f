from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListTrajectoriesRequest(_message.Message):
    __slots__ = ("service", "task", "since_ns", "limit", "assemble_first", "page_size")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLE_FIRST_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    service: str
    task: str
    since_ns: int
    limit: int
    assemble_first: bool
    page_size: int
    def __init__(self, service: _Optional[str] = ..., task: _Optional[str] = ..., since_ns: _Optional[int] = ..., limit: _Optional[int] = ..., assemble_first: _Optional[bool] = ..., page_size: _Optional[int] = ...) -> None: ...

class TrajectoryPage(_message.Message):
    __slots__ = ("trajectory_json",)
    TRAJECTORY_JSON_FIELD_NUMBER: _ClassVar[int]
    trajectory_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trajectory_json: _Optional[_Iterable[str]] = ...) -> None: ...

class CoverageRequest(_message.Message):
    __slots__ = ("since_ns", "assemble_first", "counts", "exclude_trace_ids")
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLE_FIRST_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_TRACE_IDS_FIELD_NUMBER: _ClassVar[int]
    since_ns: int
    assemble_first: bool
    counts: bool
    exclude_trace_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, since_ns: _Optional[int] = ..., assemble_first: _Optional[bool] = ..., counts: _Optional[bool] = ..., exclude_trace_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CoverageResponse(_message.Message):
    __slots__ = ("report_json",)
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    def __init__(self, report_json: _Optional[str] = ...) -> None: ...

class TraceIdsRequest(_message.Message):
    __slots__ = ("page_size",)
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    def __init__(self, page_size: _Optional[int] = ...) -> None: ...

class TraceIdPage(_message.Message):
    __slots__ = ("trace_id",)
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trace_id: _Optional[_Iterable[str]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "version", "spans_received", "spans_stored", "spans_duplicate", "spans_rejected", "queue_spans", "queue_bytes", "db_path")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SPANS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SPANS_STORED_FIELD_NUMBER: _ClassVar[int]
    SPANS_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SPANS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SPANS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DB_PATH_FIELD_NUMBER: _ClassVar[int]
    status: str
    version: str
    spans_received: int
    spans_stored: int
    spans_duplicate: int
    spans_rejected: int
    queue_spans: int
    queue_bytes: int
    db_path: str
    def __init__(self, status: _Optional[str] = ..., version: _Optional[str] = ..., spans_received: _Optional[int] = ..., spans_stored: _Optional[int] = ..., spans_duplicate: _Optional[int] = ..., spans_rejected: _Optional[int] = ..., queue_spans: _Optional[int] = ..., queue_bytes: _Optional[int] = ..., db_path: _Optional[str] = ...) -> None: ...

class Violation(_message.Message):
    __slots__ = ("invariant_id", "trajectory_id", "severity", "task_key", "step_index", "step_name", "detail")
    INVARIANT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    TASK_KEY_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_NAME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    invariant_id: str
    trajectory_id: str
    severity: str
    task_key: str
    step_index: int
    step_name: str
    detail: str
    def __init__(self, invariant_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., severity: _Optional[str] = ..., task_key: _Optional[str] = ..., step_index: _Optional[int] = ..., step_name: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class StoreCheckRequest(_message.Message):
    __slots__ = ("spec_hash", "spec_name", "spec_path", "checked_trajectory_ids", "violations")
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    SPEC_NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKED_TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    spec_hash: str
    spec_name: str
    spec_path: str
    checked_trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    violations: _containers.RepeatedCompositeFieldContainer[Violation]
    def __init__(self, spec_hash: _Optional[str] = ..., spec_name: _Optional[str] = ..., spec_path: _Optional[str] = ..., checked_trajectory_ids: _Optional[_Iterable[str]] = ..., violations: _Optional[_Iterable[_Union[Violation, _Mapping]]] = ...) -> None: ...

class StoreCheckResponse(_message.Message):
    __slots__ = ("violations_written", "runs_checked")
    VIOLATIONS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    violations_written: int
    runs_checked: int
    def __init__(self, violations_written: _Optional[int] = ..., runs_checked: _Optional[int] = ...) -> None: ...

class StoreCertificateRequest(_message.Message):
    __slots__ = ("certificate_json",)
    CERTIFICATE_JSON_FIELD_NUMBER: _ClassVar[int]
    certificate_json: str
    def __init__(self, certificate_json: _Optional[str] = ...) -> None: ...

class StoreCertificateResponse(_message.Message):
    __slots__ = ("certificates",)
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    certificates: int
    def __init__(self, certificates: _Optional[int] = ...) -> None: ...
