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
from waits import EVENT_DEADLINE_S

pytestmark = pytest.mark.slow

_SPANS = 60_000
# The release comes `memory.IDLE_SECONDS` after the last commit or assembly; the wait ends as soon as
# memory is back, so its length is only a bound for a heavily loaded machine.
SETTLE_SECONDS = EVENT_DEADLINE_S
# What may stay above idle, whatever the burst's size (docs/operating.md): about 40 MiB in each worker
# (mimalloc's and the Python heap's remnants) and 60 MiB in the writer (its threads' malloc arenas,
# DuckDB's buffer cache). Measured: 140 MiB after 60,000 spans, 154 after 200,000; 544 before.
RETAINED_MIB = 180


def _tree(pid: int) -> dict[int, dict[str, float]]:
    """VmRSS and VmHWM (the kernel's peak of VmRSS), in MiB, of a process and all its descendants, by pid."""
    found: dict[int, dict[str, float]] = {}
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{current}/status").read_text().splitlines() if ":" in line)
            found[current] = {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM") if key in fields}
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _tree_rss_mib(pid: int) -> float:
    return sum(process.get("VmRSS", 0.0) for process in _tree(pid).values())


def _quiet_rss_mib(pid: int, deadline: float) -> float:
    """The tree's RSS once it stopped changing (two readings half a second apart within 2 MiB): a server
    whose workers are still importing under load is not idle yet."""
    last = _tree_rss_mib(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _tree_rss_mib(pid)
        if abs(now - last) < 2:
            return now
        last = now
    return last


def test_memory_goes_back_toward_idle_after_a_burst(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, "--workers", "2", "--max-request-body-size-mib", "64",
                          "--queue-max-spans", str(_SPANS)).start()
    try:
        pid = server.proc.pid  # type: ignore[union-attr]
        body = burst_request(_SPANS)
        idle = _quiet_rss_mib(pid, time.monotonic() + EVENT_DEADLINE_S)
        idle_by_pid = _tree(pid)
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=600)
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        response.read()
        connection.close()
        assert response.status == 200
        del body
        # What the burst took, from how far it raised each process's kernel-kept peak: on a loaded machine the answer can
        # come after the release already ran (`memory.IDLE_SECONDS`), so the RSS seen "just after" is no
        # proof the burst took memory (issue 42 item 5); the peak is, whatever the machine's speed.
        after = _tree(pid)
        took = sum(max(0.0, v.get("VmHWM", 0.0) - idle_by_pid.get(p, {}).get("VmHWM", 0.0)) for p, v in after.items())
        deadline = time.monotonic() + SETTLE_SECONDS
        while (settled := _tree_rss_mib(pid)) - idle > RETAINED_MIB and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"tree RSS: idle {idle:.0f} MiB, taken by the burst at its peak {took:.0f} MiB, settled {settled:.0f} MiB")
        assert took > 2 * RETAINED_MIB, "the burst did not take memory: the test would prove nothing"
        assert settled - idle <= RETAINED_MIB, f"idle {idle:.0f} MiB, taken at the peak {took:.0f} MiB, settled {settled:.0f} MiB"
    finally:
        assert server.stop() == 0
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == _SPANS
