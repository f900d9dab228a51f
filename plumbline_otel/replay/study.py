"""A study opened for running: its state (instance id and key, ledger, response cache, spend cap), its plan, and one
run of it through the engine (`replay.engine`) on a pool of worker threads.

- one runner per study (``lock.StudyLock``), or, with shared state (``replay.pgstate``), one runner per trial at a time;
- resume: decided trials (an attempt ran) are skipped; without ``resume`` such a study is refused, and ``rerun`` runs
  them again as *new trials* (the next free repeat numbers); attempts a dead runner left unfinished are recorded missing;
- Ctrl-C or SIGTERM: the adapter stops its agents (`contracts.Adapter.cancel`), and every trial is still recorded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import orjson

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay.adapters import adapter_of
from plumbline_otel.replay.budget import BudgetExceeded, SpendCap, TrialBudget
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.contracts import Adapter, Runs, Trial
from plumbline_otel.replay.engine import Sealer, TrialRunner
from plumbline_otel.replay.export import RecordWriter
from plumbline_otel.replay.identity import TrialIdentity, trial_id_for
from plumbline_otel.replay.ledger import Ledger, write_jsonl
from plumbline_otel.replay.lock import StudyLock
from plumbline_otel.replay.perturb import Paraphraser
from plumbline_otel.replay.pgstate import PgLedger
from plumbline_otel.replay.plan import Plan, StudyConfig, plan_study, reservations_for
from plumbline_otel.replay.records import StudySummary
from plumbline_otel.replay.scope import TrialScope, activate
from plumbline_otel.replay.sequential import SequentialStop, order_seed, task_order
from plumbline_otel.replay.tasks import ReplayTask
from plumbline_otel.trials import STATE_FILE, AttemptRecord, KeyRing, new_key

if TYPE_CHECKING:
    from plumbline_otel.replay.pgstate import StudyClaims

class _Scoped:
    """Runs a model helper of the plan (the paraphraser, the equivalence check) inside a scope of its
    own: its calls are cached per study, so re-planning on resume or offline gives the same variants
    (and trial ids), and they are paid from the study's cap. Keyed by the helper's text arguments."""

    def __init__(self, inner: Callable[..., object], role: str, study: str, cap: SpendCap, cache: ResponseCache | None) -> None:
        self.inner, self.role, self.study, self.cap, self.cache = inner, role, study, cap, cache
        self.name = getattr(inner, "name", type(inner).__name__)  # a helper's label, as `perturb` reads it

    def __call__(self, *args: object) -> object:
        digest = hashlib.sha256("\x00".join(a for a in args if isinstance(a, str)).encode()).hexdigest()[:16]
        identity = TrialIdentity(f"{self.study}/{self.role}/{digest}", "paraphrase", "generator", self.study)
        budget = TrialBudget.open(self.cap, 0.0)
        if budget is None:
            raise BudgetExceeded(f"spend cap reached before the {self.role} ran")
        try:
            with activate(TrialScope(identity, budget, self.cache)):
                return self.inner(*args)
        finally:
            budget.close()



class Study:
    """A study opened for running: its plan, ledger, cache and cap (``open_study`` builds it)."""

    def __init__(self, config: StudyConfig, adapter: Adapter, plan: Plan, ledger: Ledger | None, cache: ResponseCache | None,
                 cap: SpendCap, instance: str = "", key: str | None = None) -> None:
        self.config, self.adapter, self.plan, self.ledger, self.cache, self.cap = config, adapter, plan, ledger, cache, cap
        self.instance, self.key = instance, key or new_key()

    def run(self, completed: set[str] | frozenset[str] = frozenset(),
            on_record: Callable[[AttemptRecord, int, int], None] | None = None) -> StudySummary:
        """Run the planned trials not yet decided (``completed``: trial ids the store holds a result for).

        Holds the study's lock throughout: a second runner is refused (``StudyLocked``).
        """
        if self.config.state_dir is None or self.config.state_url is not None:  # a shared study: claims, not a lock
            return self._run(completed, on_record)
        with StudyLock(self.config.state_dir, self.config.study):
            if self.ledger is not None:
                self.ledger.reload()  # what a runner that held the lock before us did
            return self._run(completed, on_record)

    def _run(self, completed: set[str] | frozenset[str],
             on_record: Callable[[AttemptRecord, int, int], None] | None) -> StudySummary:
        config, ledger, cache, cap = self.config, self.ledger, self.cache, self.cap
        started = time.perf_counter()
        done = set(completed) | (ledger.decided() if ledger else set())
        already = [t for t in self.plan.trials if t.trial_id in done]
        if already and not (config.resume or config.rerun or config.state_url):  # a shared study is joined, not refused
            raise ReplayError(f"study {config.study!r} already has {len(already)} of its {len(self.plan.trials)} trials decided "
                              f"(e.g. {already[0].trial_id}); pass --resume to run only the rest, --rerun to run them "
                              "all again as new trials, or choose a new --study")
        plan = self.plan
        if config.rerun and already:
            plan = replace(plan, trials=tuple(_fresh(t, done, config.repeats) for t in plan.trials))
        todo = [t for t in plan.trials if t.trial_id not in done]
        if config.target is not None:  # a sequential study runs and judges its tasks in its recorded random order (issue 38)
            todo = task_order(todo, order_seed(config.state_dir, self.instance))
        reservations = reservations_for(config, todo)
        records_out = RecordWriter(config.sink, self.key) if config.sink is not None else None
        sequential = SequentialStop(todo, config.target, config.min_tasks) if config.target is not None else None
        claims = _claims(config, todo)
        if claims is not None and isinstance(ledger, PgLedger):
            ledger.fence = claims  # an outcome is recorded only under this runner's claim (`pgstate.PgLedger`)
        sealer = Sealer(config.sink, records_out, config.grace_s) if config.sink is not None and records_out is not None else None
        runner = TrialRunner(config, self.adapter, cap, cache, ledger, records_out, reservations, sequential, claims, sealer)
        summary = StudySummary(config.study, planned=len(plan.trials), skipped=len(plan.trials) - len(todo),
                               rejected=plan.rejected, budget_usd=config.budget_usd, instance=self.instance,
                               keys=KeyRing.of(self.instance, self.key),
                               rerun_as=len(already) if config.rerun else 0)
        order = {t.trial_id: i for i, t in enumerate(plan.trials)}
        records: list[AttemptRecord] = []
        pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="replay")
        interrupted = False
        try:
            runner.plan(plan.trials)
            if ledger is not None:
                summary.recovered = self._interrupted(runner, ledger, done)
                summary.released_usd = sum(r.usd for r in cap.release_dead())  # a dead runner's reservations stop holding the cap
            futures = [pool.submit(runner.run, t) for t in todo]
            collected: set[Future[AttemptRecord]] = set()
            try:
                for future in as_completed(futures):
                    collected.add(future)
                    records.append(future.result())
                    if on_record is not None:
                        on_record(records[-1], len(records), len(todo))
            except KeyboardInterrupt as stop:
                # Ctrl-C or SIGTERM (`adapters.stop_on_sigterm`): an adapter that can stop its agents does (command agents:
                # SIGTERM, then SIGKILL after its grace), their attempts are recorded interrupted with what they spent;
                # queued trials are recorded missing ("not started: interrupted"); an in-process agent is waited for.
                interrupted = True
                runner.halt(f"interrupted ({stop})" if str(stop) else "interrupted")
                running = sum(f.running() for f in futures)
                stopped = self.adapter.cancel()
                queued = len(futures) - len(collected) - running
                print(f"plumbline replay: {runner.stop_reason}: stopping; {running} attempt(s) running"
                      + (f", {stopped} agent(s) sent SIGTERM (SIGKILL after {self.adapter.grace_s:g}s)" if stopped
                         else ", waited for (their agents run in-process)" if running else "")
                      + f"; {queued} queued trial(s) recorded as not started", file=sys.stderr, flush=True)
                records.extend(f.result() for f in futures if f not in collected)
                print(f"plumbline replay: stopped; {sum(str(r.reason or '').startswith('interrupted') for r in records)} attempt(s) "
                      "recorded interrupted with their spend; resume with --resume", file=sys.stderr, flush=True)
        finally:
            pool.shutdown(wait=True)
            if claims is not None:
                claims.close()
            if sealer is not None:
                sealer.close()  # every window of this run closes (at most the grace from now) before the study reports
            if records_out is not None:
                summary.written = records_out.written
                records_out.close()
        records.sort(key=lambda r: order[r.trial_id])
        summary.records = records
        summary.ok = sum(r.status == "ok" for r in records)
        summary.missing = sum(r.status == "missing" for r in records)
        summary.errored = sum(r.status == "errored" for r in records)
        summary.stopped = sum(r.status == "stopped" for r in records)
        summary.elsewhere = sum(r.status == "elsewhere" for r in records)
        summary.records = [r for r in records if r.status != "elsewhere"]
        summary.decided_cells = dict(sequential.decided) if sequential is not None else {}
        summary.spent_usd, summary.session_usd, summary.budget_high_water_usd = cap.spent, cap.session_usd, cap.high_water
        summary.cache_hits = sum(r.cache_hits for r in records)
        summary.cache_recorded = cache.recorded if cache else 0
        summary.seconds = time.perf_counter() - started
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _interrupted(self, runner: TrialRunner, ledger: Ledger, done: set[str]) -> list[AttemptRecord]:
        """Attempts a runner that died left started and unfinished: each is recorded missing
        ("interrupted"); the trial runs again as a new attempt."""
        by_id = {t.trial_id: t for t in self.plan.trials}
        out = []
        for trial_id, (attempt, pid) in ledger.unfinished().items():
            trial = by_id.get(trial_id)
            if trial is None or trial_id in done:
                continue
            if runner.claims is not None and not runner.claims.claim(trial_id):  # a live runner holds it: its attempt, not ours
                continue
            ident = trial.identity.at_attempt(attempt)
            record = AttemptRecord(trial_id=trial_id, task_key=ident.task_key, perturbation=ident.perturbation,
                                   variant=ident.variant, repeat=ident.repeat, study=ident.study, instance=ident.instance,
                                   status="missing", reason=f"interrupted: runner pid {pid} stopped during attempt {attempt}",
                                   attempts=1, attempt=attempt, trace_id=ident.trace_id, fault=str(trial.fault) if trial.fault else None)
            runner.write(replace(trial, identity=ident), record, 0.0)
            if runner.claims is not None:
                runner.claims.finish(trial_id, decided=False)  # fenced the lapsed runner out; free to run again
            out.append(record)
        return out


def _fresh(trial: Trial, done: set[str], repeats: int) -> Trial:
    """``trial`` as a new trial when it is decided: the next repeat number of its variant no trial has taken."""
    ident = trial.identity
    repeat = ident.repeat
    while trial_id_for(ident.study, ident.task_key or "", ident.perturbation, ident.variant, repeat) in done:
        repeat += repeats
    if repeat == ident.repeat:
        return trial
    tid = trial_id_for(ident.study, ident.task_key or "", ident.perturbation, ident.variant, repeat)
    return replace(trial, identity=replace(ident, trial_id=tid, repeat=repeat))


def _claims(config: StudyConfig, trials: Sequence[Trial]) -> StudyClaims | None:
    """A shared study's trial claims (`replay.pgstate.StudyClaims`), heartbeat started; None for a study of one runner."""
    if config.state_url is None:
        return None
    from plumbline_otel.replay.pgstate import StudyClaims

    claims = StudyClaims(config.state_url, config.study)
    claims.plan([t.trial_id for t in trials])
    claims.start_heartbeat()
    return claims


def study_state(state: Path | None, state_url: str | None = None, study: str = "") -> tuple[str, str]:
    """The study state's random instance id and secret key (``study.json``, readable by its owner only), made
    with the state; a fresh pair without a state directory; a shared study's one pair with ``state_url``.

    The key signs the driver's records (`trials.record_mac`) and is never given to an agent; a state made
    before records were signed gains a key (its earlier records stay unverified)."""
    def made() -> dict[str, str]:
        return {"instance": uuid.uuid4().hex[:16], "key": new_key(), "order_seed": uuid.uuid4().hex}  # order: sequential.task_order

    found: Mapping[str, object]
    if state_url is not None:
        from plumbline_otel.replay.pgstate import shared_state

        found = shared_state(state_url, study, made)
    elif state is None:
        found = made()
    else:
        found = _local_state(state, made)
    return str(found["instance"]), str(found["key"])


def _local_state(state: Path, made: Callable[[], dict[str, str]]) -> Mapping[str, object]:
    """``study.json`` in `state`, made or completed under an exclusive ``flock`` of its own, so that runners opening
    one study at once all read the one pair the first wrote (each made its own, and a later writer's replaced the
    file under an earlier one: two instance ids for one state, or a rename failing under the other)."""
    state.mkdir(parents=True, exist_ok=True)
    path = state / STATE_FILE
    fd = os.open(state / f"{STATE_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read and at most one small write: waiting is short
        doc: dict[str, object] = {}
        if path.exists():
            try:
                loaded = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise ReplayError(f"{path}: unreadable study state ({exc}); move it away to start a new instance of the study") from None
            if not isinstance(loaded, dict) or not isinstance(loaded.get("instance"), str) or not loaded["instance"]:
                raise ReplayError(f"{path}: no instance id; move it away to start a new instance of the study")
            doc = loaded
        found = {**made(), **doc} if isinstance(doc.get("key"), str) else {**made(), **doc, "key": new_key()}
        if found != doc:
            tmp = path.with_suffix(".tmp")
            tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(tmp_fd, "wb") as fh:
                fh.write(orjson.dumps({"created_at": time.time(), **found}) + b"\n")
            os.replace(tmp, path)
        return found
    finally:
        os.close(fd)  # and with it the lock


def open_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Adapter | Runs | Callable[[Trial], object]) -> Study:
    """Open the study's state (instance id, ledger, response cache, cumulative cap) and plan it.

    ``adapter`` is an `Adapter`, another object with ``run`` or a plain function of the trial (`adapters.adapter_of`).
    The variants file is rewritten.
    """
    driven = adapter_of(adapter)
    state = Path(config.state_dir) if config.state_dir is not None else None
    instance, key = study_state(state, config.state_url, config.study)
    ledger: Ledger | None = Ledger(state / "ledger.jsonl") if state else None
    cap = SpendCap(config.budget_usd, journal=ledger.path if ledger else None)
    if config.state_url is not None:
        from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap

        ledger, cap = PgLedger(config.state_url, config.study), PgSpendCap(config.state_url, config.study, config.budget_usd)
    if config.cassette is not None:  # re-run another study from its recording: offline, its exchanges only
        cassette = Path(config.cassette) / "responses.jsonl"
        if not cassette.is_file():
            raise ReplayError(f"--cassette {config.cassette}: no recorded exchanges there (responses.jsonl): give a study's state directory")
        cache: ResponseCache | None = ResponseCache(cassette, "replay")
    else:
        cache = ResponseCache(state / "responses.jsonl", config.cache_mode) if state and config.cache_mode != "off" else None
    planning = config
    if config.options.paraphraser is not None:
        scoped = _Scoped(config.options.paraphraser, "paraphrase-generator", config.study, cap, cache)
        # A Paraphraser called positionally, as build_variants calls it; its name is the inner one's.
        planning = replace(planning, options=replace(planning.options, paraphraser=cast("Paraphraser", scoped)))
    if config.options.equivalence is not None:
        check = _Scoped(config.options.equivalence, "equivalence-check", config.study, cap, cache)
        planning = replace(planning, options=replace(planning.options, equivalence=check))
    plan = plan_study(planning, tasks, driven, instance)
    if state:
        write_jsonl(state / "variants.jsonl", [v.as_dict() for v in plan.variants])
    return Study(config, driven, plan, ledger, cache, cap, instance, key)


def run_study(config: StudyConfig, tasks: Sequence[ReplayTask], adapter: Adapter | Runs | Callable[[Trial], object], *,
              completed: set[str] | frozenset[str] = frozenset(),
              on_record: Callable[[AttemptRecord, int, int], None] | None = None) -> StudySummary:
    """Plan and run a study (``open_study(...).run(...)``).

    ``adapter`` is an Adapter or a function of the trial; ``completed`` are trial ids already
    stored; ``on_record(record, done, total)`` is called in the calling thread as each trial ends.
    """
    return open_study(config, tasks, adapter).run(completed, on_record)
