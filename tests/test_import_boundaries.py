"""The module boundaries of the design: who may import whom, and no import circle.

learner never imports rollout or playwright; rollout never imports jax, flax,
optax or orbax (a CPU rollout node needs only the browser and HTTP); shared
imports neither side.

No module of learner/, rollout/ or shared/ imports itself through others. The import
graph (:func:`import_graph`, read with ``ast``, nothing imported):

- nodes: the modules under learner/, rollout/ and shared/; a package is its ``__init__``.
- edges: every import statement naming a project module, at module level or inside a
  function, a class, ``try`` or ``if``; only the body of ``if TYPE_CHECKING:`` is left
  out (it never runs). ``import a.b.c`` and ``from a.b.c import name`` are an edge to
  ``a.b.c``; ``from a.b import c`` is an edge to the submodule ``a.b.c`` when there is
  one, else to ``a.b`` (the name comes from its ``__init__``); relative imports are
  resolved against the importing module; ``importlib.import_module("a.b")`` with a
  literal name is ``import a.b``.
- parent packages count: importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``
  first, so it is an edge to them too (the stricter choice: a circle through a
  package's ``__init__`` is a real one, e.g. any import of ``rollout.tools.actions``
  runs ``rollout/tools/__init__``). The one exception is the importing module's own
  packages: they ran, or are running, before the module itself, so importing a
  sibling adds no dependency on them (counting it would make every ``__init__`` that
  re-exports its submodules a circle); a name taken from one of them still counts.
- not edges: ``importlib.import_module`` of a computed name. That is how a registry
  (``rollout.registry``) loads, on its first lookup, the functions that register the
  in-tree entries (``Registry(builtins=...)``): those names are data, like a plugin's
  entry points, and the modules they name import the registry, not the reverse.

Which parts of rollout/ may import which is a table, :data:`ALLOWED`, with the registry
at the bottom.
"""

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "learner": {"rollout", "playwright"},
    "rollout": {"jax", "jaxlib", "flax", "optax", "orbax", "learner"},
    "shared": {"jax", "jaxlib", "flax", "optax", "orbax", "playwright", "learner", "rollout"},
}


def imported_roots(path: Path, package: str) -> set[str]:
    """Top-level package of every import in a file, relative imports resolved to ``package``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                roots.add(package)
            elif node.module:
                roots.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_static_imports_respect_the_boundaries(package):
    files = sources(package)
    assert files, f"{package}/ has no modules"
    violations = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in sorted(imported_roots(path, package) & FORBIDDEN[package])
    ]
    assert not violations, "\n".join(violations)


def test_the_checker_sees_every_import_form(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import jax.numpy\nfrom flax import nnx\nimport importlib\n"
        "def f():\n    import optax\n"
        "importlib.import_module('playwright.async_api')\nfrom . import wire\n"
    )
    roots = imported_roots(probe, "shared")
    assert {"jax", "flax", "optax", "playwright", "shared"} <= roots


@pytest.mark.parametrize("package", ["rollout", "shared"])
def test_importing_a_package_loads_no_forbidden_module(package):
    """Transitive imports through third-party code count too: import every module and look."""
    modules = [
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in sources(package)
        if "__main__" not in p.name
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted({{n.split('.')[0] for n in sys.modules}} & set({sorted(FORBIDDEN[package])!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"importing {package} loaded {out.stdout.strip()}"


# ----------------------------------------------------------------------------- no import circle

PROJECT = ("learner", "rollout", "shared")

Graph = dict[str, dict[str, int]]  # module -> {imported module: line of the first import}


def modules_under(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` (directories under ``root``) by dotted name."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test  # ``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return name == "TYPE_CHECKING"


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def module_imports(module: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project modules ``module`` (at ``path``) imports: {module: line}, as the
    docstring of this file defines the edges."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[tuple[str, int]] = []  # (module, line) an import statement names explicitly
    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            named += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
            named += [(sub, node.lineno) for sub in subs]
            if len(subs) < len(node.names):  # a name defined in ``source`` itself
                named.append((source, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            named.append((node.args[0].value, node.lineno))
    own = set(_ancestors(module))
    edges: dict[str, int] = {}
    for name, line in named:
        if name not in modules:  # not a project module
            continue
        if name != module:
            edges.setdefault(name, line)
        for parent in _ancestors(name):  # the packages that run before ``name``
            if parent not in own and parent != module:
                edges.setdefault(parent, line)
    return edges


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    modules = modules_under(root, packages)
    return {name: module_imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """One shortest circle through each strongly connected group of modules, written
    from its smallest module; [] when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_shortest_circle(min(group), group, graph) for group in groups)


def _shortest_circle(start: str, group: set[str], graph: Graph) -> list[str]:
    paths, frontier = {start: [start]}, [start]
    while True:  # breadth first from ``start``, until a module that imports it
        for v in frontier:
            if start in graph.get(v, {}):
                return paths[v]
        reached = []
        for v in frontier:
            for w in sorted(graph.get(v, {})):
                if w in group and w not in paths:
                    paths[w] = [*paths[v], w]
                    reached.append(w)
        frontier = reached


def describe(cycle: list[str], graph: Graph, modules: dict[str, Path], root: Path) -> str:
    hops = zip(cycle, [*cycle[1:], cycle[0]], strict=True)
    return "\n".join(f"  {modules[a].relative_to(root)}:{graph[a][b]} imports {b}" for a, b in hops)


def test_no_module_imports_itself_through_others():
    graph = import_graph(REPO, PROJECT)
    assert len(graph) > 100 and graph["rollout.env"], "the graph reads no imports"
    modules = modules_under(REPO, PROJECT)
    found = [describe(c, graph, modules, REPO) for c in cycles(graph)]
    assert not found, "import circles:\n" + "\n\n".join(found)


def test_the_circle_finder_finds_every_kind_of_circle(tmp_path):
    files = {
        # a -> b (from-import of a submodule) -> c (inside a function, relative) -> a
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from .c import x\n",
        "pkg/c.py": "import pkg.a\n",
        # through a package's __init__: importing pkg.sub.e runs pkg/sub/__init__
        "pkg/sub/__init__.py": "from pkg.d import y\n",
        "pkg/sub/e.py": "",
        "pkg/d.py": "import pkg.sub.e\n",
        # a submodule taking a name from its own package's __init__, which imports it
        "pkg/own/__init__.py": "from pkg.own.m import f\nVALUE = 1\n",
        "pkg/own/m.py": "from pkg.own import VALUE\n",
        # no circles: an import only for type checkers; a sibling's import runs its parent
        "pkg/t1.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import t2\n",
        "pkg/t2.py": "import pkg.t1\n",
        "pkg/fine/__init__.py": "from pkg.fine.m import f\n",
        "pkg/fine/m.py": "import pkg.fine.n\nfrom . import n\n",
        "pkg/fine/n.py": "import json\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.b"] == {"pkg.c": 2} and graph["pkg.d"] == {"pkg.sub.e": 1, "pkg.sub": 1}
    assert graph["pkg.t1"] == {} and graph["pkg.fine.m"] == {"pkg.fine.n": 1}
    assert cycles(graph) == [
        ["pkg.a", "pkg.b", "pkg.c"],
        ["pkg.d", "pkg.sub"],
        ["pkg.own", "pkg.own.m"],
    ]
    text = describe(cycles(graph)[0], graph, modules_under(tmp_path, ["pkg"]), tmp_path)
    assert text.splitlines()[1] == "  pkg/b.py:2 imports pkg.c"


# ----------------------------------------------------------------------------- the layers of rollout

# The parts of rollout/, bottom first, and the other parts each may import (a part may
# always import its own modules). A module's part is its subpackage; a top-level module
# is "registry" when listed in REGISTRY, else one of the commands ("commands"), as is
# every ``__main__``.
ALLOWED: dict[str, set[str]] = {
    # what environments, task sources and verifiers register into, and what an action
    # table row is (rollout.action_spec): imports nothing, not even shared/
    "registry": set(),
    # the local mini web (site, data, search index, server): nothing of the agent's side
    "web": {"shared"},
    # the web an episode saw, as WARC: knows nothing of how it was fetched
    "archive": {"shared"},
    # every way out to the web and its rules: never the environment or the agent
    "net": {"archive", "shared"},
    # the episode record and the tracker that writes it
    "tracking": {"registry", "shared"},
    # research tasks generated from the local web's data
    "tasks": {"registry", "web", "shared"},
    # the agent's actions, dialects, parser and scripted policies
    "agent": {"registry", "net", "web", "shared"},
    # reward verifiers: pure functions of the task, the answer and the episode record
    "verifiers": {"registry", "tracking", "shared"},
    # the environment, the browser's three modes and the browser pool
    "env": {"registry", "agent", "archive", "net", "tracking", "verifiers", "shared"},
    # the second domain, tool calling: an environment kind with its own tasks
    "tools": {"registry", "agent", "env", "tasks", "tracking", "web", "shared"},
    # the sidecar: the engine, the episode, the inference client, the server, the dashboard
    "sidecar": {"registry", "agent", "archive", "env", "net", "tracking", "verifiers", "shared"},
    # the commands (rollout.serve, rollout.eval, ...) and every __main__: everything
    "commands": {
        "registry", "web", "archive", "net", "tracking", "tasks", "agent", "verifiers", "env",
        "tools", "sidecar", "shared",
    },
}  # fmt: skip
REGISTRY = {"rollout.registry", "rollout.action_spec"}


def part(module: str) -> str:
    """The part of the table ``module`` belongs to (its top package outside rollout/)."""
    parts = module.split(".")
    if parts[0] != "rollout":
        return parts[0]
    if module in REGISTRY:
        return "registry"
    if parts[-1] == "__main__" or module == "rollout":
        return "commands"
    if len(parts) > 1 and (REPO / "rollout" / parts[1] / "__init__.py").exists():
        return parts[1]
    return "commands"


def layering_violations(graph: Graph) -> list[str]:
    return [
        f"{a} ({part(a)}) imports {b} ({part(b)}) at line {line}"
        for a, targets in sorted(graph.items())
        if part(a) in ALLOWED
        for b, line in sorted(targets.items())
        if part(b) != part(a) and part(b) not in ALLOWED[part(a)]
    ]


def test_the_parts_of_rollout_import_only_the_parts_below_them():
    graph = import_graph(REPO, PROJECT)
    subpackages = {p.parent.name for p in (REPO / "rollout").glob("*/__init__.py")}
    assert subpackages <= set(ALLOWED), f"a new subpackage needs a row: {subpackages}"
    assert not REGISTRY - set(graph), "a listed module is gone"
    violations = layering_violations(graph)
    assert not violations, "imports the table ALLOWED forbids:\n" + "\n".join(violations)


def test_the_table_is_a_layering_with_the_registry_at_the_bottom():
    table = {a: dict.fromkeys(b & set(ALLOWED), 0) for a, b in ALLOWED.items()}
    assert cycles(table) == []
    assert ALLOWED["registry"] == set()
    below_the_registry = ("registry", "web", "archive", "net")  # know no action or kind
    assert all("registry" in b for a, b in ALLOWED.items() if a not in below_the_registry)
    assert "env" not in ALLOWED["web"] and "tools" not in ALLOWED["env"] | ALLOWED["tasks"]
    # the network layer and the archive know nothing of episodes, agents or environments
    assert not ALLOWED["net"] & {"env", "agent", "tracking", "sidecar", "verifiers"}
    assert not ALLOWED["archive"] - {"shared"}
    # the sidecar runs any registered kind: it never names a domain's package
    assert "tools" not in ALLOWED["sidecar"]


def test_the_layering_check_sees_a_forbidden_import():
    graph = {"rollout.web.server": {"rollout.env.core": 7}, "rollout.env.core": {}}
    assert layering_violations(graph) == [
        "rollout.web.server (web) imports rollout.env.core (env) at line 7"
    ]


def test_every_package_says_what_it_holds_and_what_it_may_import():
    missing = [
        str(path.relative_to(REPO))
        for package in PROJECT
        for path in sorted((REPO / package).rglob("__init__.py"))
        if "may import" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not missing, f"packages whose docstring says neither: {missing}"
