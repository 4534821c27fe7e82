"""The import graph of the xmc_tf package has no cycle, and every module of
it imports alone in a fresh interpreter.

The graph is built with :mod:`ast` from the source files, not by importing
them: an edge ``A -> B`` means that running module ``A`` (its top level or
any function in it) executes an import that needs module ``B``:

* ``import xmc_tf.a.b`` and ``from xmc_tf.a.b import name`` need
  ``xmc_tf.a.b`` and the packages on the way (``xmc_tf.a``);
* ``from xmc_tf.a import b`` where ``b`` is a submodule needs ``xmc_tf.a.b``
  (and ``xmc_tf.a``); where ``b`` is a name, ``xmc_tf.a`` (its
  ``__init__`` must have defined it);
* relative imports are resolved against the importing module's package.

The packages *enclosing* ``A`` are left out of the implicit "packages on the
way": Python has started them before ``A`` runs, and a package ``__init__``
importing its submodules while those reach their siblings through the
package path (``from xmc_tf.job.heads.base import Head`` inside
``xmc_tf/job/heads/dense.py``) is not a cycle.  An explicit import of an
enclosing package for one of its names (``import xmc_tf`` in a submodule, to
use its attributes) is an edge, and a cycle if that ``__init__`` imports
``A`` back.  Imports under ``if TYPE_CHECKING:`` never run and are skipped.
Function-level imports count: they are how cycles were hidden.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "xmc_tf"


def package_modules(root: str = ROOT, package: str = PACKAGE) -> dict:
    """``{module name: (source path, is_package)}`` of every ``.py`` file
    under ``root/package``."""
    modules = {}
    base = os.path.join(root, package)
    for directory, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        rel = os.path.relpath(directory, root).split(os.sep)
        if "__init__.py" not in files:
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            if name == "__init__.py":
                modules[".".join(rel)] = (path, True)
            else:
                modules[".".join(rel + [name[:-3]])] = (path, False)
    return modules


def _ancestors(name: str) -> set:
    """The packages enclosing module ``name`` (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


class _Imports(ast.NodeVisitor):
    """Collects ``(target, lineno, is_from_name)`` of every import statement
    that can run (skips ``if TYPE_CHECKING:`` bodies)."""

    def __init__(self, module: str, is_package: bool):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.found = []  # (imported module, [names] or None, lineno)

    def visit_If(self, node):  # noqa: N802
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node):  # noqa: N802
        for alias in node.names:
            self.found.append((alias.name, None, node.lineno))

    def visit_ImportFrom(self, node):  # noqa: N802
        if node.level:
            parts = self.package.split(".")
            if node.level > 1:
                parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts)
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module
        self.found.append((module, [a.name for a in node.names], node.lineno))


def import_graph(root: str = ROOT, package: str = PACKAGE) -> dict:
    """``{module: {imported module: first line of the import}}`` over the
    modules of ``package`` (edges to modules outside it are dropped)."""
    modules = package_modules(root, package)
    graph = {}
    for name, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        visitor = _Imports(name, is_package)
        visitor.visit(tree)
        enclosing = _ancestors(name) | {name}
        edges = {}

        def add(target, line, explicit):
            # ``explicit``: the statement needs this very module (its
            # namespace), not merely a package on the way to a submodule.
            if target not in modules or target == name:
                return
            if target in enclosing and not explicit:
                return
            edges.setdefault(target, line)

        for module, names, line in visitor.found:
            if module != package and not module.startswith(package + "."):
                continue
            for parent in _ancestors(module):
                add(parent, line, explicit=False)
            if names is None:  # import a.b.c
                add(module, line, explicit=True)
                continue
            needs_namespace = False
            for item in names:
                if item != "*" and f"{module}.{item}" in modules:
                    add(f"{module}.{item}", line, explicit=True)
                    # ``from pkg import sub`` needs pkg only on the way.
                    add(module, line, explicit=False)
                else:
                    needs_namespace = True
            if needs_namespace:
                add(module, line, explicit=True)
        graph[name] = edges
    return graph


def find_cycles(graph: dict) -> list:
    """One cycle (a list of modules, first == last) per strongly connected
    component of ``graph`` that has more than one module (Tarjan)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def strongconnect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(set(scc))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for scc in sccs:
        start = min(scc)
        # Shortest path start -> ... -> start inside the component (BFS).
        parents, frontier, found = {start: None}, [start], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w not in scc:
                        continue
                    if w == start:
                        found = v
                        break
                    if w not in parents:
                        parents[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [start]
        v = found
        while v is not None and v != start:
            path.append(v)
            v = parents[v]
        cycles.append([start] + path[1:][::-1] + [start])
    return cycles


def describe(cycle: list, graph: dict) -> str:
    """``a (line 3) -> b (line 40) -> a``: each arrow's import line."""
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


# ---------------------------------------------------------------------------
# The analysis itself, on small made-up packages.


# (made-up package files, expected edges {module: {target: line}}, expected
# cycles as sets of modules).
GRAPH_CASES = {
    # A cycle held apart only by a function-level import is still one.
    "function_level_import": (
        {"pkg/__init__.py": "",
         "pkg/a.py": "from pkg.b import f\n",
         "pkg/b.py": "def f():\n    from pkg import a\n    return a\n"},
        {"pkg": {}, "pkg.a": {"pkg.b": 1}, "pkg.b": {"pkg.a": 2}},
        [{"pkg.a", "pkg.b"}]),
    # Relative imports resolve; y reaches its sibling through its own
    # package (no edge to pkg.sub); z needs pkg.sub on the way to pkg.sub.y.
    "relative_imports_and_subpackages": (
        {"pkg/__init__.py": "from . import sub\n",
         "pkg/sub/__init__.py": "from .x import X\nfrom . import y\n",
         "pkg/sub/x.py": "from ..z import Z\nX = 1\n",
         "pkg/sub/y.py": "from pkg.sub.x import X\n",
         "pkg/z.py": "import pkg.sub.y\nZ = 2\n"},
        {"pkg": {"pkg.sub": 1},
         "pkg.sub": {"pkg.sub.x": 1, "pkg.sub.y": 2},
         "pkg.sub.x": {"pkg.z": 1},
         "pkg.sub.y": {"pkg.sub.x": 1},
         "pkg.z": {"pkg.sub": 1, "pkg.sub.y": 1}},
        [{"pkg.sub", "pkg.sub.x", "pkg.z"}]),
    # The __init__ imports its submodules: a submodule importing a sibling
    # through the package path is no cycle, one using the package's own
    # names is; TYPE_CHECKING imports never run.
    "package_init": (
        {"pkg/__init__.py": "from pkg import a, b\nVERSION = 1\n",
         "pkg/a.py": "from pkg import b\nfrom pkg.b import g\n",
         "pkg/b.py": "def g():\n    from pkg import VERSION\n",
         "pkg/c.py": "if TYPE_CHECKING:\n    from pkg import a\n"},
        {"pkg": {"pkg.a": 1, "pkg.b": 1}, "pkg.a": {"pkg.b": 1},
         "pkg.b": {"pkg": 2}, "pkg.c": {}},
        [{"pkg", "pkg.b"}]),
}


@pytest.mark.parametrize("case", sorted(GRAPH_CASES))
def test_graph_analysis_on_made_up_packages(tmp_path, case):
    files, edges, cycles = GRAPH_CASES[case]
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    graph = import_graph(str(tmp_path), "pkg")
    assert graph == edges
    found = find_cycles(graph)
    assert [set(c) for c in found] == cycles
    for c in found:  # each a closed walk along edges of the graph
        assert c[0] == c[-1] and all(b in graph[a] for a, b in zip(c, c[1:]))
    if case == "function_level_import":
        assert describe(found[0], graph) == (
            "pkg.a (line 1) -> pkg.b (line 2) -> pkg.a")


# ---------------------------------------------------------------------------
# xmc_tf.


#: What ``xmc_tf.callbacks`` exported as one module (and the two resumable
#: schedules it exports since it is a package, and the epoch line).
CALLBACKS = ["EarlyStopping", "EpochLine", "ReduceLROnPlateau", "RefreshIndex",
             "Rehash", "SetRewiring", "TopKEvaluation", "rewire"]


def test_callbacks_package_exports():
    import xmc_tf.callbacks as cbs
    assert sorted(cbs.__all__) == sorted(CALLBACKS)
    for name in CALLBACKS:
        obj = getattr(cbs, name)
        assert obj.__module__.startswith("xmc_tf.callbacks."), name


def test_xmc_tf_import_graph_has_no_cycle():
    graph = import_graph()
    assert "xmc_tf.job.workdir" in graph and "xmc_tf.job.heads.base" in graph
    # A function-level import is an edge (load_cached imports specs lazily).
    assert "xmc_tf.data.specs" in graph["xmc_tf.data.cache"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in xmc_tf:\n" + "\n".join(
        describe(c, graph) for c in cycles)


def _import_alone(module: str):
    """Runs ``import MODULE`` in a new interpreter; returns ``(module,
    returncode, the xmc_tf modules it loaded, its stderr)``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(
                   [ROOT] + [p for p in os.environ.get("PYTHONPATH", "")
                             .split(os.pathsep) if p]))
    code = (f"import sys\nimport {module}\nprint(' '.join(sorted("
            f"m for m in sys.modules if m == {PACKAGE!r} or "
            f"m.startswith({PACKAGE + '.'!r}))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    loaded = set(proc.stdout.split()) if proc.returncode == 0 else set()
    return module, proc.returncode, loaded, proc.stderr


def _last_error_line(stderr: str) -> str:
    lines = [l for l in stderr.strip().splitlines()
             if l.strip() and not l.startswith(("I0000", "W0000", "WARNING:"))]
    return lines[-1] if lines else "(no message)"


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """``python -c "import M"`` succeeds for every module M of xmc_tf.

    Python runs a package's ``__init__`` to its end before it imports a
    submodule, so a fresh ``import xmc_tf.a.b`` first runs all of
    ``import xmc_tf``; for the modules that ``import xmc_tf`` itself loads,
    a fresh ``import M`` is that same run, step for step.  So one fresh
    interpreter importing ``xmc_tf`` covers those modules, and every other
    module (where the order of imports depends on which one comes first)
    gets its own fresh interpreter, as many at a time as there are cores
    (at most 4).
    """
    modules = sorted(package_modules())
    start = time.perf_counter()
    root = _import_alone(PACKAGE)
    results = [root]
    if root[1] == 0:
        assert root[2] <= set(modules), root[2] - set(modules)
        rest = [m for m in modules if m not in root[2]]
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            results += list(pool.map(_import_alone, rest))
    failures = [f"{m}: {_last_error_line(err)}"
                for m, rc, _, err in results if rc != 0]
    assert not failures, "modules that fail to import alone:\n" + "\n".join(
        failures)
    for module, _, loaded, _ in results:
        assert module in loaded
    print(f"{len(results)} fresh interpreters for {len(modules)} modules "
          f"({len(modules) - len(results) + 1} covered by `import "
          f"{PACKAGE}`) in {time.perf_counter() - start:.1f} s")
