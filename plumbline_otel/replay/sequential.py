"""Stop a study's cell as soon as its answer is known (`plumbline replay --target`).

A cell (one perturbation of the study) is decided by the anytime-valid bound (`stats.stop_decision`,
``betting_cs``) on the tasks whose trials have all finished, taken in the study's random order: PASS
once its lower bound reaches the target, FAIL once its upper bound falls below it.

Why a random order (issue 38): the anytime guarantee is for tasks that arrive like draws from the
task population. In plan order (task keys sorted) tasks of one kind came first: with 80 tasks of
one kind then 20 of another, the rule passed 0.95 after 73 tasks while the true mean was 0.90.
`task_order` ranks each task key by a keyed hash with the study's ``order_seed`` (`order_seed`,
made with the study's state in ``study.json``), so the order is random, recorded, the same when the
study is resumed, and a task added later does not move the others. Trials of a decided cell not yet started are not run; the driver
records them as ``stopped``, and the certificate uses the same anytime-valid bound for such a study,
so the verdict stays valid under the stopping (each wrong answer at most 5% likely).

A trial counts as conforming when its run holds every critical invariant of the spec (`Judge`),
as failing when it errored, and not at all when it was missing or its perturbation was never seen
to reach the agent: exactly the certificate's rules.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.analyse.stats import stop_decision
from plumbline_otel.spec import Spec
from plumbline_otel.trials import placed

if TYPE_CHECKING:
    from plumbline_otel.replay.adapters import Trial


def order_seed(state: str | Path | None, instance: str) -> str:
    """The study's ``order_seed`` from ``<state>/study.json``; without one (a state made before issue 38,
    no state directory, a shared study), the study's random instance id, which is recorded too."""
    if state is not None:
        path = Path(state) / "study.json"
        try:
            seed = orjson.loads(path.read_bytes()).get("order_seed")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            seed = None
        if isinstance(seed, str) and seed:
            return seed
    return instance


def task_rank(seed: str, task_key: str) -> str:
    """A task's place in the study's random order: a keyed hash, so it does not depend on the other tasks."""
    return hashlib.sha256(f"{seed}\x00{task_key}".encode()).hexdigest()


def task_order(trials: Sequence[Trial], seed: str) -> list[Trial]:
    """`trials` with whole tasks in the study's random order (`task_rank`), each task's trials in plan order.

    A sequential study submits its trials, and judges its tasks, in this order (module docstring).
    """
    return sorted(trials, key=lambda t: task_rank(seed, t.identity.task_key or t.trial_id))


class SequentialStop:
    """The stopping state of a study's cells, shared by the runner's threads.

    Tasks are judged in the order `trials` gives them: the runner passes `task_order`'s.
    """

    def __init__(self, trials: Sequence[Trial], target: float, min_tasks: int = 5) -> None:
        self.target, self.min_tasks = target, min_tasks
        self._order: dict[str, list[str]] = defaultdict(list)  # perturbation -> task keys in the order of `trials`
        self._open: dict[tuple[str, str], set[str]] = defaultdict(set)  # (perturbation, task) -> trials not finished
        self._scores: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for t in trials:
            cell, task = t.identity.perturbation, t.identity.task_key or t.trial_id
            if task not in self._order[cell]:
                self._order[cell].append(task)
            self._open[(cell, task)].add(t.trial_id)
        self.decided: dict[str, str] = {}  # perturbation -> why it stopped
        self._lock = threading.Lock()

    def stopped(self, trial: Trial) -> str | None:
        """Why `trial` is not to be run (its cell is decided), or None."""
        with self._lock:
            return self.decided.get(trial.identity.perturbation)

    def finish(self, trial: Trial, conforming: bool | None) -> None:
        """A trial is over: conforming, failing, or not scored (None); decide its cell if the evidence now can."""
        cell, task = trial.identity.perturbation, trial.identity.task_key or trial.trial_id
        with self._lock:
            self._open[(cell, task)].discard(trial.trial_id)
            if conforming is not None:
                self._scores[(cell, task)].append(conforming)
            if cell in self.decided:
                return
            done = []
            for key in self._order[cell]:  # the prefix of tasks whose every trial is over
                if self._open[(cell, key)]:
                    break
                scores = self._scores[(cell, key)]
                if scores:
                    done.append((sum(scores), len(scores)))
            decision = stop_decision(done, self.target, self.min_tasks)
            if decision != "continue":
                self.decided[cell] = (f"not run: {cell} was decided {decision.upper()} against {self.target} "
                                      f"after {len(done)} task(s) (anytime-valid bound)")


class Judge:
    """Whether a trial's run holds every critical invariant, read back from the study's OTLP file.

    The file's new lines are ingested into an in-memory store as trials finish, so each run is
    assembled exactly as `plumbline ingest` will assemble it.
    """

    def __init__(self, spec: Spec, otlp_file: str | Path) -> None:
        from plumbline_otel.store import Store

        self.spec, self.path = spec, Path(otlp_file)
        self.store = Store(":memory:")
        self._offset = 0
        self._lock = threading.Lock()

    def __call__(self, trace_id: str, identity: Mapping[str, object]) -> bool | None:
        """True/False for the run in `trace_id` judged as the trial `identity` places it (`trials.placed`: its task is
        the driver's, never one its spans claim), None when no run of it has arrived."""
        with self._lock:
            self._read_new()
            from plumbline_otel.store import RunFilter

            runs = [t for t in self.store.trajectories(runs=RunFilter(trace_id=trace_id)) if t.steps]
        return evaluate(self.spec, placed(runs[0], identity)).conforms("critical") if runs else None

    def _read_new(self) -> None:
        from plumbline_otel.ingest import ingest_files

        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        if not end:
            return
        self._offset += end
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as part:
            part.write(chunk[:end])
            part.flush()
            ingest_files(self.store, [part.name], workers=0)
        self.store.assemble()

    def close(self) -> None:
        self.store.close()
