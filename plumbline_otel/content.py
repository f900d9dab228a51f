"""Drop or hash message content and tool arguments/results before anything is normalised or stored.

Rules match attribute keys with fnmatch globs (`gen_ai.input.messages`, `llm.*_messages.*`,
`gen_ai.tool.call.*`), on span attributes, span event attributes and log record attributes. A
dropped value becomes `__REDACTED__`, the marker the normaliser already reads as "the producer hid
this" (so coverage reports it as redacted, not missing). A hashed value becomes
`sha256:<hex>` of the salt and the value's canonical bytes, so equal arguments still compare equal
across runs while the content itself never reaches the disk.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Callable, Iterable

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from plumbline_otel.config import ContentRules
from plumbline_otel.model import REDACTED


def _compile(patterns: Iterable[str]) -> re.Pattern[str] | None:
    patterns = list(patterns)
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


class ContentFilter:
    """Applies `ContentRules` in place to decoded requests; a no-op when there are no rules."""

    def __init__(self, rules: ContentRules) -> None:
        self._drop = _compile(rules.drop)
        self._hash = _compile(rules.hash)
        self._salt = rules.hash_salt.encode()

    def __bool__(self) -> bool:
        return self._drop is not None or self._hash is not None

    def _hashed(self, value: AnyValue) -> str:
        raw = value.string_value.encode() if value.WhichOneof("value") == "string_value" else value.SerializeToString(deterministic=True)
        return "sha256:" + hashlib.sha256(self._salt + raw).hexdigest()

    def apply_attributes(self, attributes: Iterable[KeyValue]) -> int:
        """Rewrite matching values in place; return how many were rewritten."""
        changed = 0
        for kv in attributes:
            if self._drop is not None and self._drop.match(kv.key):
                replacement = REDACTED
            elif self._hash is not None and self._hash.match(kv.key):
                replacement = self._hashed(kv.value)
            else:
                continue
            kv.value.Clear()
            kv.value.string_value = replacement
            changed += 1
        return changed

    def apply_traces(self, request: ExportTraceServiceRequest, keep: Callable[[bytes], bool] | None = None) -> int:
        """Every span's and span event's attributes (of the spans whose trace id `keep` accepts, when given)."""
        if not self:
            return 0
        changed = 0
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if keep is not None and not keep(span.trace_id):
                        continue
                    changed += self.apply_attributes(span.attributes)
                    for event in span.events:
                        changed += self.apply_attributes(event.attributes)
        return changed

    def apply_logs(self, request: ExportLogsServiceRequest) -> int:
        """Every log record's attributes, and the top-level keys of a map-valued body (GenAI events)."""
        if not self:
            return 0
        changed = 0
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    changed += self.apply_attributes(record.attributes)
                    if record.body.WhichOneof("value") == "kvlist_value":
                        changed += self.apply_attributes(record.body.kvlist_value.values)
        return changed


__all__ = ["ContentFilter"]
