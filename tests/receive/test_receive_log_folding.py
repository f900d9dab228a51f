"""GenAI log records over OTLP logs are folded into their spans by `plumbline serve`, whichever came first."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from core.spans import content_in_logs_run
from otlp import record_with_logs, to_otlp_json
from receive_support import ServeProcess
from waits import EVENT_DEADLINE_S

from plumbline_otel.api.client import PlumblineClient


def _post(url: str, doc: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=EVENT_DEADLINE_S) as response:
        return int(response.status)


def _folded(client: PlumblineClient, trace_id: str, deadline: float) -> dict[str, Any] | None:
    """The trace's trajectory once its tool arguments (carried by log records only) are in it, read without forcing assembly."""
    while time.monotonic() < deadline:
        for t in client.trajectories(assemble_first=False):
            if t["trace_id"] == trace_id and [s["args"] for s in t["steps"] if s["kind"] == "tool_call"][0] is not None:
                return t
        time.sleep(0.1)
    return None


def test_log_records_before_or_after_their_spans_are_folded_while_serving(tmp_path: Any) -> None:
    logs_first, spans_first = record_with_logs(content_in_logs_run), record_with_logs(content_in_logs_run)
    with ServeProcess(tmp_path, "--assemble-interval", "0.2") as server, PlumblineClient(server.grpc_address) as client:
        assert _post(f"{server.http_url}/v1/logs", to_otlp_json(logs_first[1])) == 200
        assert _post(f"{server.http_url}/v1/traces", to_otlp_json(logs_first[0])) == 200
        assert _post(f"{server.http_url}/v1/traces", to_otlp_json(spans_first[0])) == 200
        # The spans-only trajectory is assembled and stored before its log records come: waited for, not
        # slept for (a second was too short for a loaded machine, and then the case was never exercised).
        spans_only = spans_first[0].resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while not any(t["trace_id"] == spans_only for t in client.trajectories(assemble_first=False)):
            assert time.monotonic() < deadline, "the spans-only trajectory was never stored"
            time.sleep(0.1)
        assert _post(f"{server.http_url}/v1/logs", to_otlp_json(spans_first[1])) == 200
        deadline = time.monotonic() + EVENT_DEADLINE_S
        got = [_folded(client, request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex(), deadline)
               for request, _ in (logs_first, spans_first)]
    for t in got:
        assert t is not None
        assert [(s["name"], s["args"]) for s in t["steps"] if s["kind"] == "tool_call"] == [
            ("audit", {"invoice_id": "INV-6"}), ("pay", {"invoice_id": "INV-6"})]
        assert (t["input"], t["final_output"]) == ("Pay INV-6", "Paid INV-6")
