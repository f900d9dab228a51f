"""Memory after a burst (issue 30 item 7): a real `plumbline serve` with shard workers takes one large
request, and its process tree goes back near its idle size once it is quiet (`plumbline_otel/memory.py`).

Before, every byte the burst freed stayed with an allocator (Arrow's pool in each worker, DuckDB's
jemalloc and glibc's arenas in the writer) and the last request's body stayed referenced by the
threads that had passed it on: after 200,000 spans the tree stayed 1,283 MiB above idle, for good.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import pytest
from corpus import burst_request
from receive_support import ServeProcess, query

pytestmark = pytest.mark.slow

_SPANS = 60_000
SETTLE_SECONDS = 20.0  # the release comes `memory.IDLE_SECONDS` after the last commit or assembly
# What may stay above idle, whatever the burst's size (docs/operating.md): about 40 MiB in each worker
# (mimalloc's and the Python heap's remnants) and 60 MiB in the writer (its threads' malloc arenas,
# DuckDB's buffer cache). Measured: 140 MiB after 60,000 spans, 154 after 200,000; 544 before.
RETAINED_MIB = 180


def _tree_rss_mib(pid: int) -> float:
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return total


def test_memory_goes_back_toward_idle_after_a_burst(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, "--workers", "2", "--max-request-body-size-mib", "64",
                          "--queue-max-spans", str(_SPANS)).start()
    try:
        pid = server.proc.pid  # type: ignore[union-attr]
        body = burst_request(_SPANS)
        time.sleep(1.0)
        idle = _tree_rss_mib(pid)
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        response.read()
        connection.close()
        assert response.status == 200
        del body
        just_after = _tree_rss_mib(pid)
        deadline = time.monotonic() + SETTLE_SECONDS
        while (settled := _tree_rss_mib(pid)) - idle > RETAINED_MIB and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"tree RSS: idle {idle:.0f} MiB, just after the answer {just_after:.0f} MiB, settled {settled:.0f} MiB")
        assert just_after - idle > 2 * RETAINED_MIB, "the burst did not take memory: the test would prove nothing"
        assert settled - idle <= RETAINED_MIB, f"idle {idle:.0f} MiB, just after {just_after:.0f} MiB, settled {settled:.0f} MiB"
    finally:
        assert server.stop() == 0
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == _SPANS
