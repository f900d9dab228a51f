"""The proxies' peak memory under hostile peers (issue 39 item 11): what each case costs the proxy process.

    .venv/bin/python bench/proxy_memory.py [--cases stream,answer,request,mcp]

Each case starts a fresh proxy in a child process (so its peak RSS is the proxy's alone: Linux's
``VmHWM``), makes the hostile exchange from this process, and reports the child's RSS before the
case and its peak during it, in MiB. The provider is ``tests/replay/hostile.py`` (raw sockets on
127.0.0.1), the tool server a tiny MCP-SDK stdio server. Default limits (``replay/limits.py``):
requests 32 MiB, answers 64 MiB, span payloads 256 KiB.

- stream: an endless SSE stream; the agent reads 1 MiB of it and hangs up. Also reported: what the
  provider managed to send after the agent left (the proxy should stop reading at once).
- answer: a 100 MiB non-streamed answer with no Content-Length (the proxy must read it to know).
- request: a 512 MiB request body streamed by the agent (refused, never read).
- mcp: a 10 MiB tool result through the MCP proxy, its span written to an OTLP file (its size reported).

Results also go to bench/out/proxy_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1 << 20

CHILD = textwrap.dedent('''
    import sys, time
    kind, upstream, spans = sys.argv[1:4]
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from plumbline_otel.replay.export import OtlpJsonFileExporter
    from plumbline_otel.replay import ReplayTask, Trial, TrialIdentity
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(spans)))
    trial = Trial(TrialIdentity("bench/t/0/k0", "baseline", "0", "bench", 0, "t"), ReplayTask("t", "t", "t"), "t")
    if kind == "model":
        from plumbline_otel.replay.proxy import ModelProxy
        proxy = ModelProxy({"openai": upstream + "/v1"}, env={}, tracer_provider=provider, timeout_s=30)
    else:
        from plumbline_otel.replay.mcp_proxy import McpProxy
        proxy = McpProxy([sys.executable, upstream], tracer_provider=provider, timeout_s=60)
    proxy.start()
    route = proxy.open_trial(trial)
    print(route.url, flush=True)
    sys.stdin.readline()  # the case is over
    proxy.close_trial(route)
    proxy.stop()
''')

TOOLS = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer
    app = MCPServer("big")

    @app.tool()
    def big(n: int) -> str:
        """A result of n bytes."""
        return "y" * n

    app.run("stdio")
''')


def _status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Child:
    """A proxy in its own process: its route URL, its RSS now and its peak."""

    def __init__(self, kind: str, upstream: str, spans: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, upstream, spans], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parent.parent))
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        time.sleep(0.5)
        self.rss_before = _status(self.proc.pid, "VmRSS")

    def finish(self) -> dict[str, float]:
        peak = _status(self.proc.pid, "VmHWM")
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(60)
        return {"rss_before_mib": round(self.rss_before, 1), "peak_mib": round(peak, 1), "growth_mib": round(peak - self.rss_before, 1)}


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].split("/", 1)[0].split(":")
    return host, int(port)


def _post(url: str, path: str, body: bytes = b"", length: int | None = None, extra: str = "") -> socket.socket:
    sock = socket.create_connection(_host_port(url), timeout=120)
    token = url.split("/t/", 1)[1].split("/", 1)[0]
    sock.sendall(f"POST /t/{token}{path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body) if length is None else length}\r\n{extra}connection: close\r\n\r\n".encode() + body)
    return sock


def case_stream(tmp: str) -> dict[str, Any]:
    from tests.replay.hostile import Hostile, endless_stream

    with Hostile(endless_stream()) as provider:
        child = Child("model", provider.url, os.path.join(tmp, "stream.jsonl"))
        sock = _post(child.url, "/v1/chat/completions", json.dumps({"model": "gpt-4o-mini", "stream": True,
                                                                     "messages": [{"role": "user", "content": "go"}]}).encode())
        got = 0
        while got < MIB:
            got += len(sock.recv(65536))
        sent_at_leave = provider.sent_bytes
        sock.close()
        stopped = provider.wait_finished(1, timeout=60)
        after = provider.sent_bytes - sent_at_leave
        time.sleep(1.0)
        out = child.finish()
    return {**out, "provider_stopped": stopped, "sent_after_agent_left_mib": round(after / MIB, 2)}


def case_answer(tmp: str) -> dict[str, Any]:
    from tests.replay.hostile import Hostile, huge_answer

    with Hostile(huge_answer(100 * MIB, declare=False)) as provider:
        child = Child("model", provider.url, os.path.join(tmp, "answer.jsonl"))
        sock = _post(child.url, "/v1/chat/completions", json.dumps({"model": "gpt-4o-mini",
                                                                     "messages": [{"role": "user", "content": "go"}]}).encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        sock.close()
        out = child.finish()
    return {**out, "status": reply.split(b" ", 2)[1].decode(), "provider_sent_mib": round(provider.sent_bytes / MIB, 1)}


def case_request(tmp: str) -> dict[str, Any]:
    from tests.replay.hostile import Hostile, answer, chat_body

    with Hostile(answer(200, chat_body())) as provider:
        child = Child("model", provider.url, os.path.join(tmp, "request.jsonl"))
        sock = _post(child.url, "/v1/chat/completions", length=512 * MIB)
        block, sent, reply = b"{" + b" " * (MIB - 1), 0, b""

        def read() -> None:
            nonlocal reply
            try:
                while chunk := sock.recv(65536):
                    reply += chunk
            except OSError:
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while sent < 512 * MIB:
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass  # refused and closed: the rest is never read
        reader.join(30)
        sock.close()
        out = child.finish()
    return {**out, "status": reply.split(b" ", 2)[1].decode() if reply else "(none)", "agent_sent_mib": round(sent / MIB, 1)}


def case_mcp(tmp: str) -> dict[str, Any]:
    import asyncio

    from mcp import Client

    server = os.path.join(tmp, "tools.py")
    Path(server).write_text(TOOLS)
    spans = os.path.join(tmp, "mcp.jsonl")
    child = Child("mcp", server, spans)

    async def agent() -> int:
        async with Client(child.url) as client:
            result = await client.call_tool("big", {"n": 10 * MIB})
            return len(getattr(result.content[0], "text", ""))

    size = asyncio.run(asyncio.wait_for(agent(), 120))
    time.sleep(0.5)
    out = child.finish()
    return {**out, "result_mib": round(size / MIB, 1), "span_file_kib": round(os.path.getsize(spans) / 1024, 1)}


CASES = {"stream": case_stream, "answer": case_answer, "request": case_request, "mcp": case_mcp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            results[name] = CASES[name](tmp)
            print(f"{name:8} {json.dumps(results[name])}", flush=True)
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "proxy_memory.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
