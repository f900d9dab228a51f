"""A standing `check` inside `plumbline serve`: newly assembled runs judged against a spec, violations sent out.

Every `interval` seconds the checker asks the writer thread (through `WriteQueue.call`, the only
way to touch the store while serving) for the runs assembled since its last pass, judges them,
stores their violations as `plumbline check` would (idempotently, keyed by spec hash, run and
invariant), and returns the violations that were not stored before. Those are the new findings:
a run re-assembled after a late span is judged again but its unchanged violations are not sent
twice, and a restart does not resend what an earlier process stored. The events leave through
`EventEmitter` off the writer thread.

A pass takes at most `_BATCHES` assemblies' worth of runs, so a large backlog (the first pass
after a restart reads every run) is worked through in slices between ingest batches instead of
holding the writer for one long pass. A violation stored just before a crash whose event was
still in the SDK's batch is not resent.
"""

from __future__ import annotations

import logging
import threading

from plumbline_otel.analyse.conformance import evaluate, write_violations
from plumbline_otel.evaluation_events import EventEmitter, violation_events
from plumbline_otel.model import Trajectory
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.receive._writer import Overloaded, WriteQueue
from plumbline_otel.runs import is_missing, is_record
from plumbline_otel.spec import DeclaredInvariant, Spec, Verdict
from plumbline_otel.store import Store

log = logging.getLogger("plumbline.check")

_BATCHES = 5  # assemblies (each up to 2000 runs) judged per pass
Found = list[tuple[Trajectory, DeclaredInvariant, Verdict]]


def new_violations(store: Store, spec: Spec, after_ns: int) -> tuple[Found, int, int]:
    """Judge the runs assembled after `after_ns` (a few assemblies at most).

    Returns the violations new to the store, the new watermark and how many runs were judged.
    """
    rows = store.assembled_after(after_ns, _BATCHES)
    if not rows:
        return [], after_ns, 0
    runs = [t for t, _ in rows if not (is_record(t) or is_missing(t))]
    results = [evaluate(spec, t) for t in runs]
    before = store.stored_violations(spec.hash, [t.trajectory_id for t in runs])
    write_violations(store, results, spec.hash)
    found = [(t, inv, verdict) for t, result in zip(runs, results) for inv, verdict in result.violations
             if (t.trajectory_id, inv.id) not in before]
    return found, max(assembled for _, assembled in rows), len(runs)


class StandingCheck:
    """Runs `new_violations` every `interval` seconds on its own thread until `stop()`."""

    def __init__(self, queue: WriteQueue, spec: Spec, interval: float, metrics: Metrics, emit_url: str | None = None) -> None:
        self._queue, self.spec, self.interval, self._metrics = queue, spec, interval, metrics
        self._emitter = EventEmitter(emit_url) if emit_url else None
        self._watermark = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plumbline-check", daemon=True)
        metrics.inc("plumbline_runs_checked_total", 0)
        metrics.inc("plumbline_violations_found_total", 0)

    def start(self) -> None:
        self._thread.start()

    def run_once(self) -> int:
        """One pass; the number of new violations found (and handed to the emitter)."""
        found, self._watermark, judged = self._queue.call(lambda store: new_violations(store, self.spec, self._watermark))
        self._metrics.inc("plumbline_runs_checked_total", judged)
        self._metrics.inc("plumbline_violations_found_total", len(found))
        if found and self._emitter is not None:
            self._emitter.emit(violation_events(self.spec, found))
        return len(found)

    def _drain(self) -> None:
        """Passes until one finds nothing newly assembled (a backlog is sliced, not skipped)."""
        while not self._stop.is_set():
            before = self._watermark
            self.run_once()
            if self._watermark == before:
                return

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._drain()
            except Overloaded:
                return  # the server is shutting down
            except Exception:  # a bug costs one pass, never the server
                log.exception("the standing check failed; retrying in %.1f s", self.interval)

    def stop(self) -> tuple[int, int]:
        """Stop checking, flush the emitter; (events accepted, events lost)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._emitter is None:
            return 0, 0
        sent, failed = self._emitter.close()
        if failed:
            log.warning("%d evaluation events could not be delivered to %s", failed, self._emitter.url)
        return sent, failed


__all__ = ["StandingCheck", "new_violations"]
