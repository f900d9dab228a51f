"""Model-API proxy overhead: the latency it adds per call and its calls/s at 64 concurrent trials,
beside direct calls to the same simulated provider.

    .venv/bin/python bench/proxy_overhead.py [--trials 64] [--calls 25] [--latency-calls 300] [--time-limit 60]

Three processes, all on 127.0.0.1, as in a study: the simulated provider (``proxy.simulated``),
the proxy (metering every call against a spend cap, optionally recording the cassette), and this
load generator, whose trials are threads each with its own keep-alive connection, making
Anthropic Messages calls (plain, then streamed). Rows:

- direct: the load generator calls the simulated provider;
- proxy: the same calls through a per-trial route of the proxy, metered against a cap;
- proxy + cassette: the same, with every exchange recorded (``ResponseCache`` in ``record`` mode).

Latency is measured one call at a time (median and p95, ms); throughput with ``--trials``
concurrent trials (calls/s over the whole run). The ratios (proxy / direct) are printed beside
them. On 2 cores the three processes share the CPU, so the figures are the proxy's cost on a
busy laptop, not a server's. Results also go to bench/out/proxy_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

MODEL = "claude-haiku-4-5"


def serve_sim() -> None:
    from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider

    sim = SimulatedProvider(lambda api, body: SimReply(text="paid INV-1029 as asked, thank you", output_tokens=12)).start()
    print(json.dumps({"url": sim.url}), flush=True)
    sys.stdin.read()  # until the bench closes our stdin


def serve_proxy(upstream: str, trials: int, cassette: str | None) -> None:
    from plumbline_otel.replay.adapters import Trial
    from plumbline_otel.replay.budget import SpendCap, TrialBudget
    from plumbline_otel.replay.cache import ResponseCache
    from plumbline_otel.replay.identity import TrialIdentity
    from plumbline_otel.replay.proxy import ModelProxy
    from plumbline_otel.replay.tasks import ReplayTask

    cache = ResponseCache(cassette, "record") if cassette else None
    proxy = ModelProxy({"anthropic": upstream, "openai": upstream + "/v1"}, cache, env={})
    proxy.start()
    cap = SpendCap(1000.0)
    task = ReplayTask("T-1", "pay", "src")
    routes = []
    for k in range(trials):
        trial = Trial(TrialIdentity(f"bench/T-1/baseline/0/k{k}", repeat=k), task, "pay")
        routes.append(proxy.open_trial(trial, TrialBudget.open(cap, 0.0)).anthropic_base_url)
    print(json.dumps({"routes": routes}), flush=True)
    sys.stdin.read()


def _spawn(*args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _call(client: httpx.Client, base: str, i: int, stream: bool) -> None:
    body = {"model": MODEL, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": f"Please pay INV-1029 (call {i}). " + "context " * 200}]}
    if stream:
        with client.stream("POST", f"{base}/v1/messages", json=body) as response:
            for _ in response.iter_bytes():
                pass
            assert response.status_code == 200, response.status_code
    else:
        response = client.post(f"{base}/v1/messages", json=body)
        assert response.status_code == 200, response.text[:200]


def latency(base: str, calls: int, stream: bool) -> dict[str, float]:
    with httpx.Client(timeout=30) as client:
        for i in range(10):  # warm the connection and the servers
            _call(client, base, i, stream)
        times = []
        for i in range(calls):
            started = time.perf_counter()
            _call(client, base, i, stream)
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"median_ms": statistics.median(times), "p95_ms": times[int(0.95 * (len(times) - 1))]}


def throughput(bases: list[str], calls: int, stream: bool, time_limit: float) -> dict[str, float]:
    done = [0] * len(bases)
    deadline = time.monotonic() + time_limit
    barrier = threading.Barrier(len(bases) + 1)

    def trial(t: int) -> None:
        with httpx.Client(timeout=60) as client:
            _call(client, bases[t], -1, stream)
            barrier.wait()
            for i in range(calls):
                if time.monotonic() > deadline:
                    return
                _call(client, bases[t], i, stream)
                done[t] += 1

    threads = [threading.Thread(target=trial, args=(t,)) for t in range(len(bases))]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"calls": sum(done), "seconds": wall, "calls_per_s": sum(done) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--calls", type=int, default=25, help="calls per trial in the throughput run")
    parser.add_argument("--latency-calls", type=int, default=300)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per throughput run at most")
    parser.add_argument("--serve-sim", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-proxy", nargs=3, metavar=("UPSTREAM", "TRIALS", "CASSETTE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_sim:
        return serve_sim()
    if args.serve_proxy:
        upstream, trials, cassette = args.serve_proxy
        return serve_proxy(upstream, int(trials), cassette if cassette != "-" else None)

    sim, info = _spawn("--serve-sim")
    procs = [sim]
    results: dict[str, Any] = {"trials": args.trials, "calls_per_trial": args.calls}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows: dict[str, list[str]] = {"direct": [info["url"]] * args.trials}
            for name, cassette in (("proxy", "-"), ("proxy + cassette", str(Path(tmp) / "cassette.jsonl"))):
                proc, routes = _spawn("--serve-proxy", info["url"], str(args.trials), cassette)
                procs.append(proc)
                rows[name] = routes["routes"]
            for stream in (False, True):
                mode = "streamed" if stream else "plain"
                for name, bases in rows.items():
                    results[f"{name}/{mode}"] = {"latency": latency(bases[0], args.latency_calls, stream),
                                                 "throughput": throughput(bases, args.calls, stream, args.time_limit)}
    finally:
        for proc in procs:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=10)
    _print(results)
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "proxy_overhead.json").write_text(json.dumps(results, indent=2))


def _print(results: dict[str, Any]) -> None:
    print(f"{'':26} {'median ms':>10} {'p95 ms':>8} {'added ms':>9} {'calls/s @' + str(results['trials']):>13} {'ratio':>6}")
    for mode in ("plain", "streamed"):
        direct = results[f"direct/{mode}"]
        for name in ("direct", "proxy", "proxy + cassette"):
            row = results[f"{name}/{mode}"]
            lat, tput = row["latency"], row["throughput"]
            added = lat["median_ms"] - direct["latency"]["median_ms"]
            ratio = tput["calls_per_s"] / direct["throughput"]["calls_per_s"]
            print(f"{name + ' (' + mode + ')':26} {lat['median_ms']:10.2f} {lat['p95_ms']:8.2f} {added:9.2f} "
                  f"{tput['calls_per_s']:13.0f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
