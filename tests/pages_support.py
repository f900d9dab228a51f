"""Support for the page tests (tests/report/test_html*.py, tests/browser): a store, a served console, a strict parse.

The store holds the retry-vs-no-retry pair from the reference domain, and a hostile trace.

`report/retry_fault/` holds the OTLP JSON lines written by
``plumbline domain run accounts_payable --arm ARM --task INV-1001 --fault check_duplicate:503
--offline --imperfections stop_retrying=1.0 --otlp-file retry_fault/ARM.otlp.jsonl`` for ARM
plan_execute and plan_execute_retry (the simulated model): on the same task and fault, the arm
without retry flags an exception and the arm with retry pays.

The hostile trace is two agents on one task whose every value is markup: pages must show it as text.

`two_studies` is a store of two replay studies, one clean and one broken, for the reports of one study.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import html5lib
import httpx
from otlp import record, to_otlp_json
from waits import EVENT_DEADLINE_S

from plumbline_otel.analyse.conformance import check
from plumbline_otel.config import load_config
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report import build_certificate, write_report
from plumbline_otel.service import Server
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

REPO = Path(__file__).resolve().parents[1]
RETRY_FAULT = Path(__file__).parent / "report" / "retry_fault"
SPEC = REPO / "configs" / "accounts_payable.invariants.yaml"
NO_RETRY, WITH_RETRY = "ap-agent-plan_execute", "ap-agent-plan_execute_retry"

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src="x" onerror="window.__pwned = 2">'
BREAKOUT = "</td></tr></table><h1 id=owned>owned</h1>"
HOSTILE_TASK = "<i>task</i>&amp;"
HOSTILE_AGENTS = ("<script>agent-a</script>", "agent-b<b>")  # A (the reference) and B of their diff


def _hostile_run(service: str, tool: str, amount: float) -> dict:
    def build(tracer) -> None:
        with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent", "plumbline.task.key": HOSTILE_TASK}):
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "plumbline.task.key": HOSTILE_TASK,
                "gen_ai.tool.call.arguments": json.dumps({"note": IMG, "amount": amount}),
                "gen_ai.tool.call.result": BREAKOUT,
            }):
                pass

    return to_otlp_json(record(build, service=service))


@dataclass(frozen=True)
class Built:
    db: Path
    cert: Path
    report: Path


def build_store(root: Path) -> Built:
    """Ingest both fixtures, judge with the AP spec, certify, and write the report."""
    root.mkdir(parents=True, exist_ok=True)
    hostile = root / "hostile.otlp.jsonl"
    hostile.write_text("\n".join(json.dumps(_hostile_run(s, SCRIPT, amount)) for s, amount in zip(HOSTILE_AGENTS, (28500.00, 285000.00))) + "\n")
    db, cert_path = root / "pages.duckdb", root / "cert.json"
    spec = load_spec(SPEC)
    with Store(db) as store:
        ingest_files(store, [str(RETRY_FAULT), str(hostile)])
        store.assemble()
        check(spec, store.trajectories(), store)
        cert = build_certificate(spec, store.trajectories())
    cert_path.write_text(cert.to_json())
    return Built(db, cert_path, write_report(db, cert_path, root / "report.html"))


_NS = {"h": "http://www.w3.org/1999/xhtml"}
TOKEN = "console-token"


def parse(html: str):
    """Strict HTML5 parse: any parse error (bad nesting, stray end tag, bad attribute) raises."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(html)


def text_of(node) -> str:
    return "".join(node.itertext())


def assert_self_contained(html: str) -> None:
    """Valid HTML5 that loads nothing: no script, no external element, no URL anywhere."""
    doc = parse(html)
    assert doc.findall(".//h:script", _NS) == [], "pages carry no script"
    for tag in ("link", "img", "iframe", "object", "embed"):
        assert doc.findall(f".//h:{tag}", _NS) == [], f"pages load no <{tag}>"
    for el in doc.iter():
        for name in ("href", "src", "action"):
            value = el.get(name)
            assert value is None or value.startswith(("#", "/")) and not value.startswith("//"), f"external {name}={value!r}"
    assert not re.search(r"(?i)\burl\(", html), "no CSS url()"
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html.replace("http://www.w3.org/2000/svg", "")), \
        "no external URL anywhere in the page"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    """An in-process `plumbline serve` (HTTP only, with a token) and a GET that sends the token."""

    def __init__(self, server: Server, url: str) -> None:
        self.server, self.url = server, url

    def get(self, path: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=EVENT_DEADLINE_S)  # a page, however slowly rendered


def serve(db: Path, cert: Path | None = None, grpc_port: int | None = None) -> Served:
    """Serve `db` on a free loopback port (and gRPC on `grpc_port`); the caller stops it (`served.server.stop()`)."""
    port = free_port()
    grpc = f"127.0.0.1:{grpc_port}" if grpc_port else ""
    overrides = {"receivers.otlp.protocols.grpc.endpoint": grpc, "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{port}",
                 "storage.path": str(db), "auth.bearer_token": TOKEN, "console.certificate": str(cert) if cert else None,
                 "assemble.interval_seconds": 0.1}
    server = Server(load_config(None, overrides))
    server.start()
    return Served(server, f"http://127.0.0.1:{port}")


# The invariant the two studies differ on (`two_studies`).
TOY_SPEC = """version: 1
name: toy
invariants:
  - {id: PAY, severity: critical, must_call: pay}
"""


def _run(study: str, agent: str, task: int, repeat: int, pays: bool, start: int) -> Trajectory:
    step = Step("tool_call", "pay" if pays else "refund", {"invoice": f"T{task}"})
    tid = f"{study}-{agent}-{task}-{repeat}"
    return Trajectory(tid, tid, f"T{task:03d}", "attribute:plumbline.task.key", agent, "1.0", None, f"Please pay invoice T{task:03d}",
                      None, ("gen_ai",), (step,), start, start + 1_000_000,
                      {"plumbline.study": study, "plumbline.trial.id": f"{tid}-trial"})


def two_studies(path: Path) -> Path:
    """Study `clean`: agents a and b always pay. Study `broken`: agent a never pays (a critical violation each run)."""
    runs = [_run("clean", agent, t, r, True, 1_000 + 10 * t + r) for agent in ("a", "b") for t in range(3) for r in range(2)]
    runs += [_run("broken", "a", t, 0, False, 9_000 + t) for t in range(4)]
    with Store(path) as store:
        store.add_trajectories(runs)
    return path
