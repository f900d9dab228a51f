"""`plumbline replay`: re-run an agent on stored tasks under perturbations, for `plumbline certify`.

Exit codes: 0 every planned trial ran (or was already decided), 3 some trials are recorded missing
or errored (the rest ran; the summary lists them), 1 a usage or setup error (no tasks, another
runner holds the study, etc.). Every planned trial and every attempt is recorded by the driver
beside the runs (`plumbline_otel.trials`): certify reads those records, not the agent's spans.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted
from plumbline_otel.cli.progress import Progress
from plumbline_otel.errors import ConfigError
from plumbline_otel.sources import Sources
from plumbline_otel.store import DEFAULT_DB
from plumbline_otel.trials import KeyRing, states_beside

if TYPE_CHECKING:
    from plumbline_otel.replay import Study, StudyConfig
    from plumbline_otel.replay.contracts import Adapter
    from plumbline_otel.replay.mcp_proxy import McpProxy
    from plumbline_otel.replay.proxy import ModelProxy
    from plumbline_otel.replay.tasks import ReplayTask


def _split(values: tuple[str, ...] | str | None) -> list[str]:
    items = [values] if isinstance(values, str) else list(values or ())
    return [p.strip() for v in items for p in v.split(",") if p.strip()]


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--adapter-option {pair!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = _value(value.strip())
    return out


def _next_steps(stores: Sources, config: StudyConfig, otlp_file: str | None, endpoint: str | None, spec: str | None,
                agent: str | None) -> str:
    spec_arg = spec or "SPEC.yaml"
    agent_arg = f" --agent {agent}" if agent else ""
    where = " ".join([*(f"--db {d}" for d in stores.dbs), *(f"--server {s}" for s in stores.servers)])
    # Certify verifies the driver's records with the study state's key: where it looks by default, or where it is.
    beside = KeyRing.beside(stores.dbs).keys
    state = "" if config.state_url is None else f" --state-url {config.state_url}"
    if not state and config.state_dir and not set(KeyRing.load([config.state_dir]).keys) <= set(beside):
        state = f" --state {config.state_dir}"
    study = config.study
    certify = f"plumbline certify --spec {spec_arg} {where} --study {study}{agent_arg}{state} --out {study}.certificate.json"
    if otlp_file:
        return f"next:\n  plumbline ingest {otlp_file} {where}\n  {certify}"
    return f"next: the spans went to {endpoint} and are stored as they arrive; certify the stores that received them:\n  {certify}"


class _ServerTraces:
    """Which traces the running servers have stored since the study began (through their gRPC API)."""

    def __init__(self, servers: tuple[str, ...]) -> None:
        from plumbline_otel.api.client import PlumblineClient

        self.clients = [PlumblineClient(server) for server in servers]
        self.since_ns = time.time_ns()
        self.seen: set[str] = set()

    def __call__(self, trace_id: str) -> bool:
        if trace_id not in self.seen:
            for client in self.clients:
                self.seen.update(str(d.get("trace_id")) for d in client.trajectories(since_ns=self.since_ns))
        return trace_id in self.seen

    def close(self) -> None:
        for client in self.clients:
            client.close()


class _PerturbationsOption(click.Option):
    """``--perturbations``, whose help lists every perturbation the code registers (read when help is shown, so
    a new one is never left out and the CLI's import stays light)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from plumbline_otel.replay.perturb import PERTURBATIONS, PROXY_PERTURBATIONS

        wire = sorted(n for n in PERTURBATIONS if n in PROXY_PERTURBATIONS)
        self.help = f"comma-separated, any of: {', '.join(PERTURBATIONS)}" + (f" ({', '.join(wire)} need --proxy)" if wire else "")
        return super().get_help_record(ctx)


@click.command("replay")
@stores_option
@click.option("--study", required=True, help="study name (plumbline.study on every trial)")
@click.option("--agent", default=None, help="tasks from this agent's runs: service or service@version")
@click.option("--task", "task_keys", multiple=True, help="only these task keys (repeatable, or comma-separated)")
@click.option("--where", default=None, help="expert option: your own SQL condition over the trajectories table of the "
              "store files (or --lake), run as written; not with --server")
@since_option
@click.option("--perturbations", cls=_PerturbationsOption, default="baseline", show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True, help="trials per variant")
@click.option("--variants", type=click.IntRange(1), default=1, show_default=True, help="variants per perturbation")
@click.option("--seed", type=int, default=7, show_default=True, help="seed of the variants")
@click.option("--fault-tools", default=None, help="tools tool_fault may fail (default: those the source run called)")
@click.option("--paraphrase-model", default=None,
              help="paraphrase with this model through the anthropic client (cached per study) instead of templates; the same "
                   "model also checks each variant beside the guard's rules, and can only reject more")
@click.option("--adapter", "adapter_spec", required=True, help='python:module:callable | command:"CMD …" | http:URL')
@click.option("--adapter-option", "adapter_options", multiple=True, metavar="KEY=VALUE",
              help="passed to a python adapter class/factory (or the command/http adapter)")
@click.option("--proxy", "use_proxy", is_flag=True,
              help="route the agent's model calls through plumbline's model-API proxy (OPENAI_BASE_URL / ANTHROPIC_BASE_URL "
                   "per attempt): it meters every call, records the cassette, applies sampling, decoy_tools, model_fault and "
                   "tool_result_fault, and witnesses each trial")
@click.option("--upstream", "upstreams", multiple=True, metavar="PROVIDER=URL",
              help="the proxy's upstream for openai or anthropic (default: OPENAI_BASE_URL / ANTHROPIC_BASE_URL here, then the public API)")
@click.option("--mcp-upstream", default=None, metavar="URL|COMMAND",
              help="put plumbline's MCP proxy in front of this MCP server (a Streamable HTTP URL, or a stdio command): each "
                   "attempt gets its own PLUMBLINE_MCP_URL; it fails the planned tool (tool_fault), offers decoy tools, and "
                   "records every tool call with its arguments and result")
@click.option("--isolate", is_flag=True,
              help="run a python adapter's attempts each in a forked child process (for agents that may exit or crash the interpreter)")
@click.option("--otlp-file", default=None, help="write spans (the agent's and the driver's records) to this OTLP JSON-lines file")
@click.option("--endpoint", default=None, help="send spans to this OTLP endpoint (a running `plumbline serve`)")
@click.option("--endpoint-protocol", type=click.Choice(["grpc", "http/protobuf"]), default=None,
              help="the --endpoint's protocol (default: said by the URL: grpc://, a path ending in /v1/traces, port 4317 or "
                   "4318; else asked of the endpoint); the agent gets OTEL_EXPORTER_OTLP_* in the form its SDK reads")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--budget-usd", type=click.FloatRange(0), default=None, help="cumulative spend cap of the study")
@click.option("--trial-max-usd", type=click.FloatRange(0), default=None,
              help="declared per-trial maximum, reserved before each trial starts (default with --budget-usd: the "
                   "price table × the source run's tokens × 1.5; a capped study with neither is refused)")
@click.option("--max-attempts", type=click.IntRange(1), default=3, show_default=True, help="tries per trial on transient errors")
@click.option("--resume", is_flag=True, help="skip decided trials (an attempt the agent ran, in the store or the ledger); run the rest")
@click.option("--rerun", is_flag=True, help="run decided trials again as new trials (the next repeat numbers), each a separate run")
@click.option("--trace-wait", type=click.FloatRange(0), default=5.0, show_default=True,
              help="seconds a finished trial's trace may take to reach the sink before the trial is errored")
@click.option("--grace", type=click.FloatRange(0), default=6.0, show_default=True,
              help="each trial's evidence window: spans of its trace that reach the sink more than this many seconds after it "
                   "ended are stored, marked late, and left out of its verdict (6 s covers a BatchSpanProcessor's flush)")
@click.option("--state-dir", default=None, help="ledger, variants and response cache (default: <db>.replay/<study>)")
@click.option("--state-url", default=None, metavar="postgresql://…",
              help="share the study with runners on other machines: its ledger, exact spend cap and trial claims in Postgres")
@click.option("--cache", "cache_mode", type=click.Choice(["record", "replay", "off"]), default="record", show_default=True,
              help="model-response cache: record, replay only (offline), off")
@click.option("--cassette", default=None, metavar="STATE_DIR", type=click.Path(file_okay=False, exists=True),
              help="re-run another study from its recording: this study's model calls are answered, offline, from that study's "
                   "state (its responses.jsonl), by task, perturbation, variant and repeat; give this study a new --study name")
@click.option("--branch-at", default=None, metavar="K|each|K1,K2",
              help="branch-point replay: up to step K the proxies answer from the task's recorded run (its tape), the "
                   "perturbation applies at K, the agent runs live after it; each branch point is a cell (tool_fault@3)")
@click.option("--branch-from", default=None, metavar="STATE_DIR", type=click.Path(file_okay=False, exists=True),
              help="with --branch-at: tape each task's recorded baseline trial from this study's cassette (default: the "
                   "task's source run in the store, which must carry its messages and tool results)")
@click.option("--service", default=None, help="label (service[@version]) the agent's runs carry, for missing markers")
@click.option("--spec", default=None, help="spec file: named in the printed certify command, and what --target judges runs by")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="sequential: stop each perturbation's trials once the anytime-valid bound decides it PASS or FAIL "
                   "against this target (needs --spec and --otlp-file); certify then uses the same bound")
@click.option("--min-tasks", type=click.IntRange(2), default=5, show_default=True,
              help="with --target: distinct tasks a perturbation must finish before it may stop")
@click.option("--dry-run", is_flag=True, help="print the plan; run nothing")
@click.option("--quiet", is_flag=True, help="no per-trial lines")
def replay(**options: Any) -> None:
    """Replay stored tasks through an agent under perturbations; print what to ingest and certify."""
    run_replay(ReplayOptions(**options))


@dataclass(frozen=True)
class ReplayOptions:
    """`plumbline replay`'s options, as click parsed them; `study_config` turns them into the library's `StudyConfig`."""

    db: tuple[str, ...]
    server: tuple[str, ...]
    study: str
    agent: str | None
    task_keys: tuple[str, ...]
    where: str | None
    since: str | None
    perturbations: str
    repeats: int
    variants: int
    seed: int
    fault_tools: str | None
    paraphrase_model: str | None
    adapter_spec: str
    adapter_options: tuple[str, ...]
    use_proxy: bool
    upstreams: tuple[str, ...]
    mcp_upstream: str | None
    isolate: bool
    otlp_file: str | None
    endpoint: str | None
    endpoint_protocol: str | None
    concurrency: int
    budget_usd: float | None
    trial_max_usd: float | None
    max_attempts: int
    resume: bool
    rerun: bool
    trace_wait: float
    grace: float
    state_dir: str | None
    state_url: str | None
    cache_mode: str
    cassette: str | None
    branch_at: str | None
    branch_from: str | None
    service: str | None
    spec: str | None
    target: float | None
    min_tasks: int
    dry_run: bool
    quiet: bool

    def perturbation_names(self) -> tuple[str, ...]:
        from plumbline_otel.replay import PERTURBATIONS

        names = _split(self.perturbations)
        unknown = [n for n in names if n not in PERTURBATIONS]
        if unknown or not names:
            raise ConfigError(f"--perturbations: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(PERTURBATIONS)}")
        return tuple(names)

    def study_config(self, stores: Sources) -> StudyConfig:
        from plumbline_otel.replay import AnthropicParaphraser, PerturbOptions, RetryPolicy, SpanSink, StudyConfig, anthropic_client
        from plumbline_otel.replay.guard import ModelEquivalenceCheck

        label, _, version = (self.service or "").partition("@")
        paraphraser = AnthropicParaphraser(anthropic_client(), self.paraphrase_model) if self.paraphrase_model else None
        equivalence = ModelEquivalenceCheck(anthropic_client(), self.paraphrase_model) if self.paraphrase_model else None
        return StudyConfig(
            study=self.study, perturbations=self.perturbation_names(), repeats=self.repeats,
            options=PerturbOptions(variants=self.variants, seed=self.seed, fault_tools=tuple(_split(self.fault_tools)), paraphraser=paraphraser,
                                 equivalence=equivalence),
            concurrency=self.concurrency, budget_usd=self.budget_usd, trial_max_usd=self.trial_max_usd, resume=self.resume,
            rerun=self.rerun, trace_wait_s=self.trace_wait, grace_s=self.grace, retry=RetryPolicy(max_attempts=self.max_attempts),
            state_dir=self.state_dir or states_beside((stores.dbs or (DEFAULT_DB,))[0]) / self.study,
            cache_mode="replay" if self.cassette else self.cache_mode, cassette=self.cassette,
            sink=SpanSink(otlp_file=self.otlp_file, endpoint=self.endpoint) if (self.otlp_file or self.endpoint) else None,
            trace_stored=_ServerTraces(self.server) if self.server and self.endpoint and not self.dry_run else None,
            service=label or None, service_version=version or None, target=self.target, min_tasks=self.min_tasks,
            state_url=self.state_url,
            judge=self.judge())

    def judge(self) -> Any:
        """For --target: whether a trial's run holds every critical invariant of --spec, read back from --otlp-file."""
        if self.target is None:
            return None
        if not self.spec or not self.otlp_file:
            raise ConfigError("--target judges each trial's run as it finishes: give --spec and --otlp-file")
        from plumbline_otel.replay.sequential import Judge
        from plumbline_otel.spec import load_spec

        return Judge(load_spec(self.spec), self.otlp_file)


def _with_tapes(config: StudyConfig, opts: ReplayOptions, stores: Sources, tasks: list[Any]) -> StudyConfig:
    """The study with each task's tape (issue 44): from --branch-from's cassette, else the task's source run; a task
    that cannot be taped is told, and its branch variants are rejected with what its run lacks."""
    from dataclasses import replace

    from plumbline_otel.replay.tape import TapeError, parse_branch_at, tape_for_task, tape_from_trajectory

    wanted = parse_branch_at(opts.branch_at or "")
    tapes: dict[str, Any] = {}
    missing: dict[str, str] = {}
    runs = {} if opts.branch_from else {t.trajectory_id: t for t in stores.trajectories()
                                        if t.trajectory_id in {task.source_trajectory_id for task in tasks}}
    for task in tasks:
        try:
            if opts.branch_from:
                tape = tape_for_task(Path(opts.branch_from) / "responses.jsonl", task.task_key)
            elif task.source_trajectory_id in runs:
                tape = tape_from_trajectory(runs[task.source_trajectory_id])
            else:
                raise TapeError(f"task {task.task_key}: its source run {task.source_trajectory_id} is not in the store")
        except TapeError as exc:
            missing[task.task_key] = str(exc)
            click.echo(f"branch-at: {exc}", err=True)
            continue
        tapes[task.task_key] = tape
        cover = tape.coverage()
        click.echo(f"branch-at: task {task.task_key}: {cover['steps']} steps ({cover['model_steps']} model, {cover['tool_steps']} tool)"
                   + (f"; missing: {'; '.join(cover['gaps'])}" if cover["gaps"] else ""), err=True)
    return replace(config, branch_at=wanted, tapes=tapes, branch_missing=missing)


def _print_plan(plan: Any) -> None:
    for v in plan.variants:
        status = f"REJECTED: {v.rejected}" if v.rejected else "ok"
        meta = {k: ([d.get("name") for d in val] if k == "decoy_tools" else val) for k, val in v.metadata.items()}
        click.echo(f"  {v.task_key} {v.perturbation}/{v.variant_id} {status}\n    {v.text!r} {json.dumps(meta, default=str)}")


def _start_proxies(opts: ReplayOptions, prepared: Study, adapter: Adapter, tasks: list[ReplayTask]) -> list[ModelProxy | McpProxy]:
    """The study's witnesses in the agent's path: the model-API proxy (the study's cassette) and the MCP proxy,
    their spans to the study's sink under the agent's name."""
    import shlex
    from dataclasses import replace

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from plumbline_otel.replay.mcp_proxy import McpProxy
    from plumbline_otel.replay.proxy import ModelProxy

    label = opts.service or adapter.service or (tasks[0].service if tasks else None) or "unknown_service"
    service, _, version = label.partition("@")
    provider: TracerProvider | None = None
    sink = prepared.config.sink
    if sink is not None:
        attrs = {"service.name": service, **({"service.version": version} if version else {})}
        provider = TracerProvider(resource=Resource.create(attrs))
        provider.add_span_processor(SimpleSpanProcessor(sink.exporter()))
    proxies: list[ModelProxy | McpProxy] = []
    if opts.use_proxy:
        proxies.append(ModelProxy(parse_upstreams(opts.upstreams), prepared.cache, tracer_provider=provider))
    if opts.mcp_upstream:
        upstream = opts.mcp_upstream if opts.mcp_upstream.startswith(("http://", "https://")) else shlex.split(opts.mcp_upstream)
        state = Path(prepared.config.state_dir or ".")
        state.mkdir(parents=True, exist_ok=True)
        errlog = (state / "mcp-server.log").open("a", encoding="utf-8")  # a stdio server's stderr; open while the proxy runs
        proxies.append(McpProxy(upstream, tracer_provider=provider, errlog=errlog))
    started: list[ModelProxy | McpProxy] = []
    try:
        for proxy in proxies:
            proxy.start()
            started.append(proxy)
    except BaseException:
        for proxy in started:
            proxy.stop()
        raise
    prepared.config = replace(prepared.config, proxies=(*prepared.config.proxies, *proxies))
    for proxy in proxies:
        click.echo(f"{type(proxy).__name__} on {proxy.url}: each attempt gets its own route", err=True)
    return proxies


def parse_upstreams(pairs: tuple[str, ...]) -> dict[str, str]:
    upstreams = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or name.strip() not in ("openai", "anthropic") or not url.strip():
            raise ConfigError(f"--upstream {pair!r}: expected openai=URL or anthropic=URL")
        upstreams[name.strip()] = url.strip()
    return upstreams


def _state_keys(config: StudyConfig) -> KeyRing:
    """The study's own key, when its state exists already: resume believes only records the driver signed."""
    keys = KeyRing.load([config.state_dir]) if config.state_dir else KeyRing()
    if config.state_url:
        from plumbline_otel.replay.pgstate import shared_keys

        keys = keys.merged(shared_keys(config.state_url))
    return keys


def run_replay(opts: ReplayOptions) -> None:
    """Source the tasks, open the study, run it (or print its plan), write its summary, say what comes next."""
    from plumbline_otel.replay import CommandAdapter, HttpAdapter, IsolatedAdapter, load_adapter, open_study, source_tasks
    from plumbline_otel.replay.adapters import adapter_of, stop_on_sigterm
    from plumbline_otel.replay.perturb import PROXY_PERTURBATIONS

    stop_on_sigterm()  # a service manager's stop records the started trials as interrupted, as Ctrl-C does

    names = opts.perturbation_names()
    wire = sorted(set(names) & PROXY_PERTURBATIONS)
    if wire and not opts.use_proxy:
        raise ConfigError(f"{', '.join(wire)} live on the wire between the agent and its model provider: pass --proxy "
                          "(the agent's model calls go through plumbline's model-API proxy, which injects and witnesses them)")
    if bool(opts.otlp_file) == bool(opts.endpoint) and not opts.dry_run:
        raise ConfigError("give exactly one of --otlp-file and --endpoint (where the trials' spans and markers go)")
    if opts.endpoint and not opts.dry_run:
        from plumbline_otel.replay.otlp import resolve_endpoint

        target = resolve_endpoint(opts.endpoint, opts.endpoint_protocol)  # the driver's exporter and every agent use this
        click.echo(f"spans to {target.url} over {target.protocol} ({'as given' if target.how == 'given' else 'by its ' + target.how})",
                   err=True)
    stores = sources(opts.db, opts.server, assemble=True)
    config = opts.study_config(stores)
    if opts.branch_at and not (opts.use_proxy or opts.mcp_upstream):
        raise ConfigError("--branch-at serves the prefix through plumbline's proxies: pass --proxy (and --mcp-upstream for MCP tools)")
    source = source_tasks(stores, opts.study, _state_keys(config), agent=opts.agent, task_keys=_split(opts.task_keys) or None,
                          since_ns=parse_since(opts.since), where=opts.where)
    if stores.single_db is None:
        warn_misrouted(stores)
    if opts.branch_at:
        config = _with_tapes(config, opts, stores, source.tasks)
    adapter = adapter_of(load_adapter(opts.adapter_spec, _options(opts.adapter_options)))
    if opts.isolate:
        if isinstance(adapter, (CommandAdapter, HttpAdapter)):
            raise ConfigError("--isolate applies to python: adapters; a command or HTTP agent already runs in its own process")
        adapter = IsolatedAdapter(adapter)
    if opts.endpoint and not opts.server and isinstance(adapter, (CommandAdapter, HttpAdapter)):
        click.echo("note: with --endpoint the driver sees only spans exported through it; give --server (the server's "
                   "gRPC address) so runs of an agent in another process are confirmed in the store", err=True)
    proxies: list[ModelProxy | McpProxy] = []
    try:
        prepared = open_study(config, source.tasks, adapter)
        plan = prepared.plan
        if (opts.use_proxy or opts.mcp_upstream) and not opts.dry_run:
            proxies = _start_proxies(opts, prepared, adapter, source.tasks)
        click.echo(f"{len(source.tasks)} task(s) × {', '.join(names)} × {opts.repeats} repeat(s): {len(plan.trials)} trials, "
                   f"{len(plan.rejected)} variant(s) rejected; agent {adapter.describe() or opts.adapter_spec}")
        if source.missing:
            click.echo(f"{len(source.missing)} trial(s) of this study have no attempt that reached the agent yet; "
                       "they run (again) as new attempts")
        if opts.dry_run:
            _print_plan(plan)
            return

        with Progress("replaying", len(plan.trials), "trials", opts.quiet) as progress:

            def trial_done(record: Any, done: int, total: int) -> None:
                if not opts.quiet:
                    extra = f"  {record.reason}" if record.reason else ""
                    progress.note(f"[{done}/{total}] {record.status:<7} {record.trial_id}  {record.seconds:.2f}s{extra}")
                progress.update(done, total)

            summary = prepared.run(source.completed, on_record=trial_done)
    finally:
        for proxy in proxies:
            proxy.stop()
        adapter.close()
        if isinstance(config.trace_stored, _ServerTraces):
            config.trace_stored.close()
        close_judge = getattr(config.judge, "close", None)
        if callable(close_judge):
            close_judge()
        if config.sink is not None:
            config.sink.close()
    state = Path(config.state_dir or ".")
    (state / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n", encoding="utf-8")
    click.echo(summary.render())
    click.echo(f"state: {state} (ledger.jsonl, variants.jsonl, responses.jsonl, summary.json)")
    agent_label = opts.service or adapter.service
    click.echo(_next_steps(stores, config, opts.otlp_file, opts.endpoint, opts.spec, agent_label))
    if summary.missing or summary.errored:
        sys.exit(3)
