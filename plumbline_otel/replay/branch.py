"""Starting a branch-point replay from the console (issue 44 item 5): "replay from here" on a run's page.

Off unless the operator turns it on for `plumbline serve`, and only behind the server's bearer token:

    PLUMBLINE_CONSOLE_REPLAY_ADAPTER   the agent to re-run (``--adapter``: ``command:python my_agent.py``, …);
                                       set, it turns the console's replay on (serve must have a token)
    PLUMBLINE_CONSOLE_REPLAY_ARGS      more ``plumbline replay`` options, as a shell would split them
                                       (``--upstream openai=URL --mcp-upstream 'python tools.py'``)
    PLUMBLINE_CONSOLE_REPLAY_DIR       where each replay's files go (default ``<db>.console-replays``)

A request names only the run, the step and (optionally) one perturbation of a fixed list; the agent and every
other option are the operator's. Each replay is a ``plumbline replay --branch-at K`` subprocess of its own (never
a shell) in a directory of its own: the run is copied into a store there (``run.duckdb``: the served store is
held by serve), the replay's output goes to ``output.log`` and its spans to ``spans.jsonl``, which serve takes
into its own store when the replay ends, so its runs and records show in the console beside the original. The
serve's token is never in the replay's environment (the agent under test inherits it).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from plumbline_otel.model import Trajectory
from plumbline_otel.replay.jsonvalue import JsonObject
from plumbline_otel.replay.tape import TapeError, ToolStep, tape_from_trajectory

ENV_ADAPTER = "PLUMBLINE_CONSOLE_REPLAY_ADAPTER"
ENV_ARGS = "PLUMBLINE_CONSOLE_REPLAY_ARGS"
ENV_DIR = "PLUMBLINE_CONSOLE_REPLAY_DIR"
#: What a console request may ask for at a step; anything else is refused.
PERTURBATIONS = ("tool_fault", "tool_result_fault", "model_fault", "decoy_tools", "baseline")
#: Variables never handed to the replay (and so to the agent it runs): the serve's credentials.
_SECRET_ENV = ("PLUMBLINE_AUTH_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
_TAIL = 6000


@dataclass
class ReplayJob:
    """One replay started from the console: what it runs, where its files are, how it ended."""

    id: str
    run_id: str
    step: int
    perturbation: str
    study: str
    directory: Path
    command: list[str]
    started: float = field(default_factory=time.time)
    process: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    ended: float | None = None
    ingested: str | None = None  # what serve did with its spans when it ended

    @property
    def state(self) -> str:
        if self.returncode is None:
            return "running"
        return "done" if self.returncode in (0, 3) else "failed"  # 3: some trials missing or errored (the summary says)

    def output(self) -> str:
        """The last part of what the replay printed."""
        try:
            data = (self.directory / "output.log").read_bytes()
        except OSError:
            return ""
        text = data[-_TAIL:].decode("utf-8", "replace")
        return ("…" + text) if len(data) > _TAIL else text

    def as_dict(self) -> JsonObject:
        return {"id": self.id, "run": self.run_id, "step": self.step, "perturbation": self.perturbation, "study": self.study,
                "state": self.state, "returncode": self.returncode, "started": self.started, "ended": self.ended,
                "directory": str(self.directory), "command": shlex.join(self.command), "ingested": self.ingested,
                "output": self.output()}


class ConsoleReplay:
    """Starts and follows the console's replays (`start`, `job`, `jobs`); `close` stops those still running."""

    def __init__(self, adapter: str, directory: str | Path, extra: Sequence[str] = (), *, python: str = sys.executable,
                 max_running: int = 2, ingest: Callable[[Path], str] | None = None, env: Mapping[str, str] | None = None) -> None:
        if not adapter.strip():
            raise ValueError(f"{ENV_ADAPTER} is empty: give the agent to re-run (an --adapter value)")
        self.adapter, self.directory, self.extra = adapter, Path(directory), list(extra)
        self.python, self.max_running, self.ingest = python, max_running, ingest
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in _SECRET_ENV}
        self._jobs: dict[str, ReplayJob] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str], db_path: str, token: bool,
                 ingest: Callable[[Path], str] | None = None) -> tuple[ConsoleReplay | None, str]:
        """The launcher the operator configured, or None and why the console's replay is off."""
        adapter = env.get(ENV_ADAPTER, "").strip()
        if not adapter:
            return None, f"off: set {ENV_ADAPTER} (the agent to re-run) for `plumbline serve` to start replays from here"
        if not token:
            return None, "off: starting a replay from the console needs serve's bearer token (auth.bearer_token)"
        directory = env.get(ENV_DIR) or f"{db_path}.console-replays"
        return cls(adapter, directory, shlex.split(env.get(ENV_ARGS, "")), ingest=ingest), "on"

    def command(self, run: Trajectory, step: int, perturbation: str, study: str, directory: Path) -> list[str]:
        """The ``plumbline replay`` command of a replay of ``run`` from ``step``."""
        return [self.python, "-m", "plumbline_otel.cli.main", "replay", "--db", str(directory / "run.duckdb"), "--study", study,
                "--agent", str(run.service), "--task", str(run.task_key), "--branch-at", str(step), "--perturbations", perturbation,
                "--proxy", "--adapter", self.adapter, "--otlp-file", str(directory / "spans.jsonl"), *self.extra]

    def start(self, run: Trajectory, step: int, perturbation: str | None = None) -> ReplayJob:
        """Start a replay of ``run`` from ``step`` (a tool step under ``tool_fault``, a model step under ``model_fault``,
        unless ``perturbation`` says otherwise); ``TapeError`` (nothing started) when the run cannot be branched there."""
        if run.task_key is None or not run.input or not run.service:
            raise TapeError(f"run {run.trajectory_id} has no task key, request or agent name: there is no task to replay")
        tape = tape_from_trajectory(run)
        chosen = perturbation or ("tool_fault" if isinstance(tape.step(step), ToolStep) else "model_fault")
        if chosen not in PERTURBATIONS:
            raise TapeError(f"perturbation {chosen!r}: the console starts one of {', '.join(PERTURBATIONS)}")
        tape.check_branch(step, chosen)
        with self._lock:
            running = [j for j in self._jobs.values() if j.returncode is None]
            if len(running) >= self.max_running:
                raise TapeError(f"{len(running)} replay(s) already running ({', '.join(j.id for j in running)}): wait for one to end")
            job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
            directory = self.directory / job_id
            directory.mkdir(parents=True)
            study = f"console-{job_id}"
            job = ReplayJob(job_id, run.trajectory_id, step, chosen, study, directory, self.command(run, step, chosen, study, directory))
            self._jobs[job_id] = job
        from plumbline_otel.store import Store

        with Store(directory / "run.duckdb") as store:  # the run alone: the served store is serve's
            store.add_trajectories([run])
        with (directory / "output.log").open("wb") as log:
            job.process = subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=self.env, start_new_session=True)
        threading.Thread(target=self._follow, args=(job,), name=f"plumbline-console-replay-{job_id}", daemon=True).start()
        return job

    def _follow(self, job: ReplayJob) -> None:
        assert job.process is not None
        code = job.process.wait()
        spans = job.directory / "spans.jsonl"
        if self.ingest is not None and spans.is_file():
            try:
                job.ingested = self.ingest(spans)
            except Exception as exc:  # the replay's result stays in its directory either way
                job.ingested = f"not taken into the store: {type(exc).__name__}: {exc}"
        job.ended = time.time()
        job.returncode = code  # last: a job is "running" until its spans were taken in

    def job(self, job_id: str) -> ReplayJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self) -> list[ReplayJob]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    def close(self, grace: float = 5.0) -> None:
        """Stop the replays still running (their process groups: the replay and the agents it started)."""
        import signal

        for job in self.jobs():
            if job.process is not None and job.process.poll() is None:
                try:
                    os.killpg(job.process.pid, signal.SIGTERM)
                    job.process.wait(grace)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(job.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


__all__ = ["ENV_ADAPTER", "ENV_ARGS", "ENV_DIR", "PERTURBATIONS", "ConsoleReplay", "ReplayJob"]
