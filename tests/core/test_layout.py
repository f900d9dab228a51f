"""The layout docs/architecture.md draws holds in the code: no package loops, the store owns its tables, public names are listed."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import types
from pathlib import Path

import pytest

import plumbline_otel

PACKAGE = Path(plumbline_otel.__file__).parent
GENERATED = ("plumbline_pb2.py", "plumbline_pb2_grpc.py")


def _sources() -> list[Path]:
    return [f for f in sorted(PACKAGE.rglob("*.py")) if f.name not in GENERATED]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every plumbline_otel module `path` imports, at any depth of the file (deferred imports count)."""
    name = _module_name(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
    return {t for t in found if t.startswith("plumbline_otel.")}


def _unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: the unit a dependency is drawn between."""
    return module.split(".")[1]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _sources():
        name = _module_name(path)
        if name == "plumbline_otel":
            continue
        graph.setdefault(_unit(name), set()).update(_unit(t) for t in _imports(path) if _unit(t) != _unit(name))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in `graph`, as the path that closes it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_package_imports_a_package_that_imports_it() -> None:
    graph = _graph()
    assert {"analyse", "receive", "store", "cli", "model"} <= set(graph), "the graph covers the tree"
    assert _cycle(graph) is None, f"import cycle between packages: {' -> '.join(_cycle(graph) or [])}"


def test_a_package_s_private_modules_are_imported_only_inside_it() -> None:
    reaching_in = []
    for path in _sources():
        name = _module_name(path)
        for target in _imports(path):
            parts = target.split(".")
            private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            owner = ".".join(parts[:private or 0])
            if private is not None and name != owner and not name.startswith(owner + "."):
                reaching_in.append(f"{name} imports {target}")
    assert reaching_in == []


@pytest.mark.parametrize("core", ["model", "errors", "compare_values", "runs"])
def test_the_core_imports_nothing_from_the_stages(core: str) -> None:
    assert _graph().get(core, set()) <= {"model", "errors"}, f"{core} imports {_graph()[core]}"


def test_only_the_product_cli_knows_the_reference_domain() -> None:
    users = [str(p.relative_to(PACKAGE)) for p in _sources() if re.search(r"^\s*(from|import) domains\b", p.read_text(), re.M)]
    assert users == [], f"the product imports the reference domain directly in {users}; domains register themselves"


# SQL that changes the file: outside the store package, only reads are allowed.
_WRITES = re.compile(r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|(CREATE|ALTER|DROP)\s+(OR\s+REPLACE\s+)?"
                     r"(TEMP\s+)?(TABLE|VIEW|INDEX|SEQUENCE)|BEGIN|COMMIT|ROLLBACK|CHECKPOINT)\b")


# Statements outside the store package that are not writes to the store, each with why.
_NOT_STORE_WRITES = {
    ("lake.py", "BEGIN TRANSACTION"): "a read snapshot of the store while the lake copies it",
    ("lake.py", "COMMIT"): "the end of that read snapshot",
}
_OTHER_DATABASES = {"replay/pgstate.py": "the shared study state, in Postgres"}


def _writes(where: str, tree: ast.AST) -> list[str]:
    """The texts of a module that write to a database (a placeholder read as a word break: `INSERT {}INTO`)."""
    return [f"{where}:{line}: {text.strip()[:60]!r}" for line, text in _texts(tree)
            if _WRITES.search(text.replace("{}", " ")) and (where, text.strip()) not in _NOT_STORE_WRITES]


def test_only_the_store_writes_to_the_database() -> None:
    writers = []
    for path in _sources():
        where = str(path.relative_to(PACKAGE))
        if where.startswith("store/") or where in _OTHER_DATABASES:
            continue
        writers += _writes(where, ast.parse(path.read_text()))
    assert writers == []


# A query: SELECT ... FROM, or a COPY of one. Outside the store package only its read module (`store/_read*.py`) and its
# writer build them, so every reader goes through `store.Reader`; the modules below own other engines, each with why.
_QUERY = re.compile(r"\bSELECT\b[\s\S]*\bFROM\b|\bCOPY\s*\(", re.IGNORECASE)
_OWN_ENGINES = {
    **_OTHER_DATABASES,
    "lake.py": "the lake: Iceberg tables through its own DuckDB, and the snapshot of the store's tables it copies into them",
}


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each placeholder as {} (so a query split by them still reads whole)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def test_only_the_store_s_read_module_builds_queries() -> None:
    builders = []
    for path in _sources():
        where = str(path.relative_to(PACKAGE))
        if where.startswith("store/") or where in _OWN_ENGINES:
            continue
        builders += [f"{where}:{line}: {text.strip()[:60]!r}" for line, text in _texts(ast.parse(path.read_text())) if _QUERY.search(text)]
    assert builders == []


def test_the_query_rule_sees_a_query_split_by_placeholders() -> None:
    tree = ast.parse('x = f"SELECT {a} FROM {b} WHERE c = ?"\ny = "select doc"\n')
    found = [t for n in ast.walk(tree) if (t := _text(n)) is not None and _QUERY.search(t)]
    assert found == ["SELECT {} FROM {} WHERE c = ?"]


def _joined(node: ast.AST) -> tuple[str, list[ast.AST]] | None:
    """A text expression's text and the nodes it is made of: a literal, an f-string, or a `+` of pieces one of which is text
    (each other piece read as a placeholder, {}); None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _joined(node.left), _joined(node.right)
        if left is None and right is None:
            return None
        return ((left[0] if left else "{}") + (right[0] if right else "{}"),
                [node, *(left[1] if left else []), *(right[1] if right else [])])
    text = _text(node)
    if text is None:
        return None
    return text, [node, *(node.values if isinstance(node, ast.JoinedStr) else [])]


def _texts(tree: ast.AST) -> list[tuple[int, str]]:
    """Every text of a module that could be sent to a database, each whole: literals, f-strings and `+` concatenations
    (a query split by placeholders or built by pieces still reads as one); docstrings are left out."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body
                  and isinstance(n.body[0], ast.Expr)}
    parts: set[int] = set()
    found = []
    for node in ast.walk(tree):  # breadth first: a whole text comes before its pieces
        if id(node) in parts or id(node) in docstrings or (joined := _joined(node)) is None:
            continue
        parts.update(id(n) for n in joined[1])
        found.append((getattr(node, "lineno", 0), joined[0]))
    return found


# Calls that send SQL: outside the store, one whose statement the rules above cannot read (a variable, a call's result)
# is a hole in them. The lake's engine may pass statements it builds itself (every text of lake.py is read by the rules
# above), never one from elsewhere; these pass statements through without building any, each with why.
_SQL_CALLS = frozenset({"execute", "executemany", "sql"})
_FORWARDERS = {("report/data.py", "OneCursor.execute"): "gives the store Reader's own queries to one cursor (one interrupt stops any)"}


def _readable(statement: ast.AST) -> bool:
    """Text the rules read, or a driver's wrapper of one (SQLAlchemy's `text("SELECT …")`)."""
    if _joined(statement) is not None:
        return True
    return isinstance(statement, ast.Call) and len(statement.args) == 1 and not statement.keywords and _readable(statement.args[0])


def _unread_statements(where: str, tree: ast.AST) -> list[str]:
    """`.execute(`/`.executemany(`/`.sql(` calls of a module whose statement is not text the rules read.

    In an engine's own module (`_OWN_ENGINES`), a statement built from the module's own names passes (its texts are
    read); one that uses an imported name does not.
    """
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names}
    found = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = f"{scope}.{child.name}".lstrip(".") if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) else scope
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in _SQL_CALLS
                    and child.args and not _readable(child.args[0]) and (where, scope) not in _FORWARDERS):
                names = {n.id for n in ast.walk(child.args[0]) if isinstance(n, ast.Name)}
                if where not in _OWN_ENGINES or names & imported:
                    found.append(f"{where}:{child.lineno}: {ast.unparse(child)[:80]}")
            visit(child, inner)

    visit(tree, "")
    return found


def test_every_statement_sent_outside_the_store_is_text_the_rules_read() -> None:
    unread = []
    for path in _sources():
        where = str(path.relative_to(PACKAGE))
        if not where.startswith("store/") and where not in _OTHER_DATABASES:
            unread += _unread_statements(where, ast.parse(path.read_text()))
    assert unread == []


def test_the_layout_rules_see_a_statement_in_any_spelling() -> None:
    module = ast.parse(
        'a = f"INSERT {ignore}INTO {target} BY NAME SELECT * FROM rows"\n'  # the f-string lake.py once had
        'b = "DELETE " + "FROM spans WHERE " + clause\n'
        'c = "SELECT doc " + f"FROM {table}"\n'
        'def f(db, sql):\n    """INSERT INTO docstrings (never sent)."""\n    db.execute(sql)\n    db.sql(STATEMENT)\n'
        '    db.execute("SELECT 1 FROM t")\n    db.execute(text("SELECT 2"), {"k": 1})\n    db.execute(text(sql))\n'
        'from elsewhere import STATEMENT\n')
    assert [t for _, t in _texts(module)] == ["INSERT {}INTO {} BY NAME SELECT * FROM rows", "DELETE FROM spans WHERE {}",
                                              "SELECT doc FROM {}", "SELECT 1 FROM t", "SELECT 2", "k"]
    assert [w.split(": ", 1)[1] for w in _writes("x.py", module)] == ["'INSERT {}INTO {} BY NAME SELECT * FROM rows'",
                                                                     "'DELETE FROM spans WHERE {}'"]
    assert [w.split(": ", 1)[1] for w in _unread_statements("x.py", module)] == ["db.execute(sql)", "db.sql(STATEMENT)",
                                                                                  "db.execute(text(sql))"]
    # an engine's own statements, and text wrapped by a driver's function (imported), pass
    assert [w.split(": ", 1)[1] for w in _unread_statements("lake.py", module)] == ["db.sql(STATEMENT)"]


def _packages() -> list[types.ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(plumbline_otel.__path__, "plumbline_otel.") if m.ispkg]
    return [importlib.import_module(n) for n in ["plumbline_otel", *names]]


@pytest.mark.parametrize("package", _packages(), ids=lambda m: m.__name__)
def test_every_package_lists_exactly_its_public_names(package: types.ModuleType) -> None:
    def defined_here(value: object) -> bool:  # what it imports for its own use (typing, protobuf) is not its API;
        # what it re-exports on purpose (a type alias, `spec.Rule`) is listed, and must exist
        origin = getattr(value, "__module__", None)
        return not isinstance(origin, str) or origin.startswith(package.__name__)

    listed = set(getattr(package, "__all__", ()))
    assert listed <= set(vars(package)), f"listed but not there: {listed - set(vars(package))}"
    own = {n for n, v in vars(package).items() if not n.startswith("_") and not isinstance(v, types.ModuleType) and defined_here(v)}
    assert own - {"annotations"} <= listed, f"public but not listed in __all__: {own - listed}"


def test_a_domain_registers_through_its_entry_point_and_a_broken_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from plumbline_otel import plugins
    from plumbline_otel.errors import ConfigError

    assert plugins.domain_plugin("accounts_payable").demo is not None  # pyproject.toml's entry point, installed
    with pytest.raises(ConfigError, match="no domain 'payroll' is installed; installed domains: accounts_payable"):
        plugins.domain_plugin("payroll")
    broken = EntryPoint("payroll", "domains.payroll.plugin:PLUGIN", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken])
    with pytest.raises(ConfigError, match=r"domain plugin payroll \(domains.payroll.plugin:PLUGIN\): cannot load: ModuleNotFoundError"):
        plugins.domain_plugins()


# --- the replay wing's contracts (issue 42 item 1) -----------------------------------------------------------------------

REPLAY = PACKAGE / "replay"


def _replay_sources() -> list[Path]:
    return [p for p in _sources() if p.is_relative_to(REPLAY)]


def _module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module in `graph` (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            if group:
                found.append(sorted([*group, node]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


# Cycles between modules that are known, each with why; the test fails when one is gone (take it off the list) as much
# as when a new one appears.
_KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def test_the_module_cycle_finder_finds_a_cycle_through_a_package() -> None:
    assert _module_cycles({"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}) == [["p", "p.a", "p.b"]]
    assert _module_cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it() -> None:
    """No import cycle between files, anywhere in the package (deferred and type-only imports count: a cycle hidden
    in a function or under TYPE_CHECKING is still two modules that cannot be read, or changed, one without the other)."""
    names = {_module_name(p) for p in _sources()}
    graph = {_module_name(p): {t for t in _imports(p) if t in names and t != _module_name(p)} for p in _sources()}
    assert {tuple(c) for c in _module_cycles(graph)} == set(_KNOWN_CYCLES), (
        f"import cycles between modules: {_module_cycles(graph)}; a piece takes what it needs as data or a narrow "
        "protocol (`proxy.exchange.ProxyServices`, `store._read_coverage.Reader`), never the module that calls it")


def _calls(path: Path, function: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id == function]


def test_the_driver_reads_an_adapter_only_through_its_contract() -> None:
    """`replay.contracts.Adapter` names every member the driver and the command may read; none is looked up by name."""
    lookups = []
    for path in [*_replay_sources(), PACKAGE / "cli" / "replay.py", PACKAGE / "cli" / "demo.py"]:
        for call in _calls(path, "getattr") + _calls(path, "hasattr"):
            if call.args and "adapter" in ast.unparse(call.args[0]).lower():
                lookups.append(f"{path.relative_to(PACKAGE)}:{call.lineno}: {ast.unparse(call)}")
    assert lookups == [], "read the member through contracts.Adapter (AdapterBase gives its default)"


def test_trial_routing_is_written_once() -> None:
    """Which open attempt a proxied request belongs to is `replay.routing`'s alone: both proxies use its table."""
    copies = []
    for path in _replay_sources():
        where = str(path.relative_to(PACKAGE))
        if where == "replay/routing.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "parse_baggage":
                copies.append(f"{where}:{node.lineno}: reads trial baggage")
            if isinstance(node, ast.Name) and node.id == "TRIAL_ATTEMPT" and where.startswith(("replay/proxy/", "replay/mcp_proxy/")):
                copies.append(f"{where}:{node.lineno}: keys routes by attempt")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "/t/"):
                copies.append(f"{where}:{node.lineno}: parses a route token")
    assert copies == [], "route through replay.routing (RoutingTable, split_token)"


def test_the_driver_s_record_is_one_class() -> None:
    """The record the driver writes and every reader reads is `trials.AttemptRecord`; no second class carries it."""
    shaped = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                if {"trial_id", "attempt", "status", "fault_fired"} <= fields:
                    shaped.append(f"{_module_name(path)}.{node.name}")
    assert shaped == ["plumbline_otel.trials.AttemptRecord"]


def _mentions_any(node: ast.AST | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and re.search(r"\bAny\b", n.value) is not None)
        for n in ast.walk(node))


def _public_any(path: Path) -> list[str]:
    """Public signatures (functions, methods, a public class's fields) of `path` whose annotations say `Any`."""
    found: list[str] = []

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (not node.name.startswith("_") or node.name in ("__init__", "__call__")):
                a = node.args
                annotations = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None]
                if any(_mentions_any(x) for x in [*annotations, node.returns]):
                    found.append(f"{owner}{node.name}")
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{owner}{node.name}.")
            elif (owner and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and not node.target.id.startswith("_") and _mentions_any(node.annotation)):
                found.append(f"{owner}{node.target.id}")

    visit(ast.parse(path.read_text()).body, "")
    return found


# Replay modules whose public signatures still say `Any`, each with why; the list only shrinks (the test fails when a
# module listed here no longer needs to be). Empty: the whole wing is typed, JSON with `replay.jsonvalue` (JsonObject
# built or owned, Mapping[str, object] only read), provider wire JSON read through `proxy.wire`'s narrowing helpers.
_ANY_NOT_YET: dict[str, str] = {}


def test_the_replay_wing_s_public_signatures_say_no_any() -> None:
    """The contracts (`contracts`, `routing`), the driver (`runner`, `plan`, `engine`, `records`, `study`), the adapters
    and the proxies' servers are typed without `Any`; the modules still listed in `_ANY_NOT_YET` carry JSON."""
    untyped = {str(p.relative_to(PACKAGE)): found for p in _replay_sources() if (found := _public_any(p))}
    assert {k: v for k, v in untyped.items() if k not in _ANY_NOT_YET} == {}, "type them (contracts.JsonValue for JSON)"
    assert sorted(set(_ANY_NOT_YET) - set(untyped)) == [], "typed now: take them off _ANY_NOT_YET"


# --- the error tree (issue 42 item 4) ------------------------------------------------------------------------------------

_TREE_LINE = re.compile(r"^ {4}(?P<lead>[ │├└─]*)(?P<name>[A-Z]\w*)")


def _error_classes() -> dict[str, set[str]]:
    """Every class of the package deriving from PlumblineError (by the names its bases are written with) -> its bases."""
    bases: dict[str, set[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}
                bases.setdefault(node.name, set()).update(names)
    errors = {"PlumblineError"}
    while grown := {name for name, of in bases.items() if name not in errors and of & errors}:
        errors |= grown
    return {name: bases[name] & errors for name in errors}


def _drawn_tree(doc: str) -> dict[str, str | None]:
    """The tree `errors.py`'s docstring draws: each class named -> the class it is drawn under (None for the root)."""
    parents: dict[str, str | None] = {}
    above: list[tuple[int, str]] = []
    for line in doc.splitlines():
        if (match := _TREE_LINE.match(line)) is None:
            continue
        column = len(match["lead"])
        while above and above[-1][0] >= column:
            above.pop()
        parents[match["name"]] = above[-1][1] if above else None
        above.append((column, match["name"]))
    return parents


def test_the_tree_finder_reads_a_drawn_tree() -> None:
    doc = "Tree:\n\n    Root\n    ├── A   a\n    │   └── B   b\n    └── C   c\n\nText."
    assert _drawn_tree(doc) == {"Root": None, "A": "Root", "B": "A", "C": "Root"}


def test_every_plumbline_error_is_drawn_in_the_error_tree_under_its_base() -> None:
    """The map in errors.py's docstring names every `PlumblineError` subclass, wherever it lives, under the class it
    derives from, and nothing that is not one."""
    tree = _drawn_tree(ast.get_docstring(ast.parse((PACKAGE / "errors.py").read_text())) or "")
    classes = _error_classes()
    assert sorted(set(classes) - set(tree)) == [], "draw them in the tree in plumbline_otel/errors.py's docstring"
    assert sorted(set(tree) - set(classes)) == [], "drawn in errors.py's tree but no PlumblineError any more"
    misplaced = {name: (tree[name], sorted(of)) for name, of in classes.items() if name != "PlumblineError" and tree[name] not in of}
    assert misplaced == {}, "drawn under a class it does not derive from: (drawn under, its bases)"
