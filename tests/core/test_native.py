"""The compiled hot path (`_native.py`, built by mypyc at install) and its pure-Python source agree.

The compiled modules are used only while every source has the digest it was compiled from;
otherwise, or when asked, the source runs. Both must store the same rows and trajectories from every producer's spans.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel import _native

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # what this interpreter loads, e.g. .cpython-311-x86_64-linux-gnu.so

# Prints one digest per input: its span rows and its trajectories, as the store would insert them.
DIGESTS = r"""
import hashlib, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from corpus import build_requests, odd_type_requests
from plumbline_otel import _native
from plumbline_otel.assemble import assemble_runs
from plumbline_otel.decode import decode_unit, iter_units
from plumbline_otel.normalise import normalise_request
from plumbline_otel.rows import span_table, trajectory_table

def digest(requests):
    records = [rec for request in requests for rec in normalise_request(request)[0]]
    by_trace = {}
    for rec in records:
        by_trace.setdefault(rec.trace_id, []).append(rec)
    trajectories = [t for recs in by_trace.values() for t in assemble_runs(recs)]
    rows = repr(span_table(records, 1).to_pylist()) + repr(trajectory_table(trajectories, 1).to_pylist())
    return f"{len(records)} {len(trajectories)} {hashlib.sha256(rows.encode()).hexdigest()}"

print(_native.BUILD)
fixtures = Path(sys.argv[1], "fixtures")
for path in sorted(p for p in fixtures.rglob("*.otlp.*") if not p.name.startswith("logs.")):
    print(path.relative_to(fixtures), digest(decode_unit(unit).request for unit in iter_units(path)))
print("corpus", digest(build_requests(3000, 500)))
print("odd types", digest(odd_type_requests(500)))
"""


def _digests(pure: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    if pure:
        env[_native.PURE_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", DIGESTS, str(ROOT / "tests")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.slow
def test_compiled_and_pure_python_store_the_same_rows_and_trajectories_from_every_producer() -> None:
    if _native.BUILD != "compiled":
        pytest.skip(f"this install runs {_native.BUILD}: nothing compiled to compare")
    compiled, pure = _digests(pure=False), _digests(pure=True)
    assert compiled[0] == "compiled" and pure[0].startswith("pure Python")
    assert len(compiled) > 20 and all(line.split()[1] != "0" for line in compiled[1:])  # every input gave spans
    assert compiled[1:] == pure[1:]


def _tree(tmp_path: Path, compiled: bool) -> Path:
    """A package tree as an install leaves it: sources, and when compiled their binaries and digests."""
    for path in _native.COMPILED:
        source = tmp_path / path
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {path}\n")
        if compiled:
            source.with_name(("__init__" if source.name == "__init__.py" else source.stem) + SUFFIX).write_bytes(b"")
    if compiled:
        (tmp_path / _native.BUILT_FROM).write_text(json.dumps({_native.ABI: _native.digests(tmp_path)}))
    return tmp_path


def test_a_build_is_used_only_while_every_compiled_module_matches_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    assert _native.build_state(_tree(tmp_path / "bare", compiled=False)) == "pure Python (not compiled at install)"

    root = _tree(tmp_path / "built", compiled=True)
    assert _native.build_state(root) == "compiled"

    extract = root / "plumbline_otel/normalise/_extract.py"
    original = extract.read_text()
    extract.write_text(original + "x = 1\n")  # edited after the build
    assert _native.build_state(root) == (
        "pure Python (plumbline_otel/normalise/_extract.py changed after the build: `pip install -e .` compiles it again)")
    extract.write_text(original)  # the same text again (a checkout back): the build matches
    assert _native.build_state(root) == "compiled"

    unfinished = "pure Python (the last install did not finish compiling: `pip install -v -e .` shows why)"
    record = (root / _native.BUILT_FROM).read_text()
    (root / _native.BUILT_FROM).write_text(json.dumps({".cpython-399-other.so": json.loads(record)[_native.ABI]}))
    assert _native.build_state(root) == unfinished, "another interpreter's build is not this one's"
    (root / _native.BUILT_FROM).unlink()  # binaries with no record of what they were built from (a build cut short, or failed)
    assert _native.build_state(root) == unfinished

    root = _tree(tmp_path / "partial", compiled=True)
    (root / f"plumbline_otel/rows{SUFFIX}").unlink()
    assert _native.build_state(root) == "pure Python (plumbline_otel/rows.py was not compiled)"

    monkeypatch.setenv(_native.PURE_ENV, "1")
    assert _native.build_state(_tree(tmp_path / "again", compiled=True)) == "pure Python (PLUMBLINE_PURE_PYTHON is set)"


def test_pure_python_on_request_imports_every_compiled_module_from_its_source() -> None:
    probe = "import importlib, plumbline_otel._native as n; print('\\n'.join(importlib.import_module(n._module_name(p)).__file__ for p in n.COMPILED))"
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, _native.PURE_ENV: "1"}, capture_output=True, text=True, timeout=EVENT_DEADLINE_S)  # imports: 20 s and more under load
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ROOT / path) for path in _native.COMPILED]


def test_version_says_whether_the_hot_path_runs_compiled() -> None:
    from click.testing import CliRunner

    from plumbline_otel.cli.main import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"plumbline, version 0.1.0; hot path: {_native.BUILD}"


@pytest.mark.parametrize(("module", "name"), [("model", "SpanRecord"), ("model", "Step"), ("model", "ToolCallRef"), ("model", "Trajectory"), ("normalise/_messages", "Message")])
def test_a_written_out_init_takes_its_data_class_fields_with_their_defaults(module: str, name: str) -> None:
    # These `__init__`s are written out so that mypyc compiles them (model.py); each must stay its
    # data class's own: every field, in order, with the same defaults and a fresh list or map each.
    # (Checked by calling it: a compiled `__init__` shows no signature.)
    import ast
    import dataclasses
    import importlib

    cls = getattr(importlib.import_module("plumbline_otel." + module.replace("/", ".")), name)
    fields = dataclasses.fields(cls)
    # the annotations as written: a compiled class's `fields()` types say `type` for any union
    tree = ast.parse((ROOT / "plumbline_otel" / f"{module}.py").read_text())
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name).body
    kinds = {node.target.id: ast.unparse(node.annotation) for node in body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}

    def value(n: int, kind: str) -> Any:  # one of the field's own type (a compiled class checks)
        if kind.startswith(("int", "bool")):
            return True if kind == "bool" else n
        if kind.startswith("float"):
            return n + 0.5
        return [f"v{n}"] if kind.startswith("list") else (f"v{n}",) if kind.startswith("tuple") else {"k": n} if kind.startswith("dict") else f"v{n}"

    every = {f.name: value(n, kinds[f.name]) for n, f in enumerate(fields)}
    assert dataclasses.asdict(cls(*every.values())) == every
    assert dataclasses.asdict(cls(**every)) == every
    required = {f.name: every[f.name] for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for missing in required:
        with pytest.raises(TypeError):
            cls(**{k: v for k, v in required.items() if k != missing})
    first, second = cls(**required), cls(**required)
    for f in fields:
        if f.name in required:
            continue
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(first, f.name) == f.default_factory() and getattr(first, f.name) is not getattr(second, f.name), f.name
        else:
            assert getattr(first, f.name) == f.default, f.name
    changed = next(iter(required))
    assert dataclasses.replace(first, **{changed: every[changed] + "!"}) == cls(**{**required, changed: every[changed] + "!"})
