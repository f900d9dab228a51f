"""Reading a spec from YAML, with every error naming the file, the line and the reason.

The document is composed first (`yaml.compose`) so each mapping keeps its start mark; values
are then constructed from the same nodes, and every check that fails points at the node that
carries the offending value. Duplicate keys in one mapping are errors (YAML loaders silently
keep the last one, which would hide a second `severity:` or a second kind).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from plumbline_otel.compare_values import Rule, rule_from
from plumbline_otel.errors import SpecError
from plumbline_otel.spec._context import Condition, import_module, load_provider
from plumbline_otel.spec._kinds import KINDS, Predicate
from plumbline_otel.spec._spec import SPEC_VERSION, DeclaredInvariant, Spec
from plumbline_otel.spec._verdict import SEVERITIES

_TOP = ("version", "name", "predicates", "context", "invariants", "effect_tools", "arg_types", "description")
_INVARIANT_KEYS = ("id", "severity", "description", "when")


def load_spec(path: str | Path) -> Spec:
    """Read and validate a YAML spec file; raises SpecError (file:line: reason)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec ({exc.strerror or exc})") from exc
    return parse_spec(text, source=str(path), base_dir=path.parent)


def parse_spec(text: str, source: str = "<spec>", base_dir: Path | None = None) -> Spec:
    """Parse spec text; `base_dir` resolves relative context files and local predicate modules."""
    return _Reader(source, base_dir).read(text)


class _Reader:
    def __init__(self, source: str, base_dir: Path | None) -> None:
        self.source = source
        self.base_dir = base_dir

    def error(self, node: yaml.Node | None, reason: str) -> SpecError:
        line = node.start_mark.line + 1 if node is not None else 1
        return SpecError(f"{self.source}:{line}: {reason}")

    def read(self, text: str) -> Spec:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            line = mark.line + 1 if mark is not None else 1
            problem = getattr(exc, "problem", None) or str(exc)
            raise SpecError(f"{self.source}:{line}: not valid YAML ({problem})") from exc
        finally:
            loader.dispose()
        if not isinstance(root, yaml.MappingNode):
            raise self.error(root, "a spec is a mapping with version, name and invariants")
        try:
            top = self.mapping(root, loader)
            for key, (knode, _) in top.items():
                if key not in _TOP:
                    raise self.error(knode, f"unknown top-level key {key!r} (known: {', '.join(_TOP)})")
            return self.build(root, top, loader)
        except yaml.YAMLError as exc:  # e.g. an unknown tag, found while constructing values
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            raise SpecError(f"{self.source}:{line}: {getattr(exc, 'problem', None) or exc}") from exc

    def mapping(self, node: yaml.MappingNode, loader: yaml.SafeLoader) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, str):
                raise self.error(knode, f"keys are strings, got {key!r}")
            if key in out:
                raise self.error(knode, f"duplicate key {key!r} (also at line {out[key][0].start_mark.line + 1})")
            out[key] = (knode, vnode)
        return out

    def value(self, node: yaml.Node, loader: yaml.SafeLoader) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.mapping(node, loader)  # rejects duplicate keys at any depth
            for _, sub in node.value:
                self.value(sub, loader)
        elif isinstance(node, yaml.SequenceNode):
            for sub in node.value:
                self.value(sub, loader)
        return loader.construct_object(node, deep=True)

    def build(self, root: yaml.MappingNode, top: dict[str, tuple[yaml.Node, yaml.Node]], loader: yaml.SafeLoader) -> Spec:
        get = {k: self.value(v, loader) for k, (_, v) in top.items()}
        version = get.get("version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise self.error(top["version"][1] if "version" in top else root, f"unsupported spec version {version!r} (this reads {SPEC_VERSION})")
        name = get.get("name") or Path(self.source).stem
        if not isinstance(name, str):
            raise self.error(top["name"][1], "name must be a string")
        predicates, pred_module = self.predicates(top, get)
        context_ref, provider = self.context(top, get)
        if "invariants" not in top:
            raise self.error(root, "no invariants: a spec declares at least one")
        inv_node = top["invariants"][1]
        if not isinstance(inv_node, yaml.SequenceNode) or not inv_node.value:
            raise self.error(inv_node, "invariants must be a non-empty list")
        invariants = [self.invariant(item, loader, predicates) for item in inv_node.value]
        seen: dict[str, int] = {}
        for inv in invariants:
            if inv.id in seen:
                raise SpecError(f"{self.source}:{inv.line}: duplicate invariant id {inv.id!r} (first declared at line {seen[inv.id]})")
            seen[inv.id] = inv.line or 0
        return Spec(
            name=name,
            invariants=tuple(invariants),
            version=SPEC_VERSION,
            predicates=pred_module,
            context_ref=context_ref,
            context_provider=provider,
            effect_tools=self.effect_tools(top, get),
            arg_rules=self.arg_rules(top, get),
            source=self.source,
        )

    def predicates(self, top: dict[str, Any], get: dict[str, Any]) -> tuple[dict[str, Predicate], str | None]:
        if "predicates" not in top:
            return {}, None
        node, ref = top["predicates"][1], get["predicates"]
        if not isinstance(ref, str) or not ref:
            raise self.error(node, "predicates names a module with a PREDICATES mapping")
        try:
            module = import_module(ref, self.base_dir)
        except ValueError as exc:
            raise self.error(node, str(exc)) from exc
        table = getattr(module, "PREDICATES", None)
        if not isinstance(table, Mapping) or not all(callable(f) for f in table.values()):
            raise self.error(node, f"{ref} has no PREDICATES mapping of name to function")
        return dict(table), ref

    def context(self, top: dict[str, Any], get: dict[str, Any]) -> tuple[str | None, Any]:
        if "context" not in top:
            return None, None
        node, raw = top["context"][1], get["context"]
        if isinstance(raw, str):
            raw = {"provider": raw}
        if not isinstance(raw, Mapping) or "provider" not in raw or set(raw) - {"provider", "key"}:
            raise self.error(node, "context is a mapping with provider (and optionally key)")
        try:
            provider = load_provider(str(raw["provider"]), self.base_dir, str(raw.get("key", "task_key")))
        except ValueError as exc:
            raise self.error(node, str(exc)) from exc
        ref = str(raw["provider"]) + (f"#key={raw['key']}" if "key" in raw else "")
        return ref, provider

    def effect_tools(self, top: dict[str, Any], get: dict[str, Any]) -> tuple[str, ...] | None:
        if "effect_tools" not in top:
            return None
        raw = get["effect_tools"]
        if not isinstance(raw, list) or not all(isinstance(t, str) and t for t in raw):
            raise self.error(top["effect_tools"][1], "effect_tools is a list of tool names")
        return tuple(raw)

    def arg_rules(self, top: dict[str, Any], get: dict[str, Any]) -> dict[str, Rule]:
        """``arg_types: {tool: {arg: type | {type:…, tolerance:…} | ignore}}``."""
        if "arg_types" not in top:
            return {}
        node, raw = top["arg_types"][1], get["arg_types"]
        if not isinstance(raw, Mapping):
            raise self.error(node, "arg_types maps tool names to {argument: type}")
        out = {}
        for tool, fields in raw.items():
            if not isinstance(fields, Mapping):
                raise self.error(node, f"arg_types.{tool} maps argument names to types")
            ignore = [a for a, t in fields.items() if t == "ignore"]
            try:
                typed = {str(a): rule_from(t) for a, t in fields.items() if t != "ignore"}
            except ValueError as exc:
                raise self.error(node, f"arg_types.{tool}: {exc}") from exc
            out[str(tool)] = Rule(type="dict", fields=typed, ignore=frozenset(map(str, ignore)))
        return out

    def invariant(self, node: yaml.Node, loader: yaml.SafeLoader, predicates: dict[str, Predicate]) -> DeclaredInvariant:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, "each invariant is a mapping with id, severity and one kind")
        keys = self.mapping(node, loader)
        vals = {k: self.value(v, loader) for k, (_, v) in keys.items()}
        line = node.start_mark.line + 1
        inv_id = vals.get("id")
        if not isinstance(inv_id, str) or not inv_id.strip():
            raise self.error(node, "invariant without an id (a non-empty string)")
        label = f"invariant {inv_id}"
        if vals.get("severity") not in SEVERITIES:
            where = keys["severity"][1] if "severity" in keys else node
            raise self.error(where, f"{label}: severity must be one of {', '.join(SEVERITIES)}, got {vals.get('severity')!r}")
        kinds = [k for k in keys if k not in _INVARIANT_KEYS]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise self.error(keys[unknown[0]][0], f"{label}: unknown kind or key {unknown[0]!r} (kinds: {', '.join(sorted(KINDS))})")
        if len(kinds) != 1:
            raise self.error(node, f"{label}: exactly one kind per invariant, found {len(kinds)}")
        kind = kinds[0]
        try:
            check = KINDS[kind](vals[kind], predicates)
        except ValueError as exc:
            raise self.error(keys[kind][1], f"{label}: {kind}: {exc}") from exc
        when = None
        if "when" in vals:
            try:
                when = Condition.parse(vals["when"])
            except ValueError as exc:
                raise self.error(keys["when"][1], f"{label}: {exc}") from exc
        description = vals.get("description") or ""
        if not isinstance(description, str):
            raise self.error(keys["description"][1], f"{label}: description must be a string")
        return DeclaredInvariant(inv_id, vals["severity"], check, description, when, line)
