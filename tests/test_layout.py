"""The shape of the code: every module of ``pystrads/`` has a docstring that says what it holds,
no import runs from a lower layer to a higher one, the engine's four parts (the Program API, the
scheduler, the executor's side, the driver's side) import only the parts before them, and no
modules of ``pystrads/`` or ``jobs/`` import each other (directly or round a longer circle).
Imports inside functions count."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "pystrads")

#: each layer may import the ones before it, never one after it (a top-level module is its own
#: layer, named without ``.py``; a package's modules are all in the package's layer)
LAYERS = ["errors", "kernels", "spark", "ps", "daemon", "config", "datasets", "engine", "programs", "ml", "session",
          "testing"]


def _modules(root, package):
    """``(dotted module name, path, source)`` of every module below ``root``."""
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                if rel.endswith(".__init__"):
                    rel = rel[: -len(".__init__")]
                yield rel, path, open(path, encoding="utf-8").read()


def _imports(module, path, text, known, bare=""):
    """The modules of ``known`` that ``module`` imports (absolute and relative, at any depth;
    ``bare``: a prefix that plain names may stand for, as ``jobs.`` for the jobs, which import
    each other by their file names)."""
    is_package = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if bare and bare + name.partition(".")[0] in known:
                name = bare + name
            while name and name not in known:  # ``a.b.c`` may name a module, or a thing in ``a.b``
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _graph(root, package):
    modules = {m: (p, t) for m, p, t in _modules(root, package)}
    bare = package + "." if package == "jobs" else ""
    return {m: _imports(m, p, t, modules, bare) for m, (p, t) in modules.items()}


def _layer(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_has_a_docstring():
    modules = {m: t for m, _, t in _modules(ROOT, "pystrads")}
    assert len(modules) > 40, sorted(modules)  # the walk found the package
    bare = [m for m, text in modules.items() if not (ast.get_docstring(ast.parse(text)) or "").strip()]
    assert not bare, f"modules without a docstring saying what they hold: {bare}"


def test_every_part_of_the_package_has_a_layer():
    parts = {_layer(m) for m in _graph(ROOT, "pystrads")} - {None}
    assert parts <= set(LAYERS), f"give these a place in LAYERS: {sorted(parts - set(LAYERS))}"


def _back_imports(graph, place_of, order):
    """``module imports other`` for every import from a place (``place_of(module)``, None: no
    place) to one after it in ``order``."""
    wrong = []
    for module, imported in graph.items():
        place = place_of(module)
        if place is None:
            continue
        for other in imported:
            target = place_of(other)
            if target is not None and order.index(target) > order.index(place):
                wrong.append(f"{module} imports {other}")
    return sorted(wrong)


def test_no_layer_imports_a_later_one():
    wrong = _back_imports(_graph(ROOT, "pystrads"), _layer, LAYERS)
    assert not wrong, wrong


#: the engine's parts, each a package of ``pystrads/engine/``: each may import the ones before it,
#: never one after it -- the Program API nothing of the engine, the executor's side (what Spark's
#: tasks run) never the driver's
ENGINE_PARTS = ["program", "scheduler", "executor", "driver"]


def _engine_part(module):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engine" else None


def _engine_cross_imports(graph):
    """``module imports other`` for every import from an engine part to a later one."""
    return _back_imports(graph, _engine_part, ENGINE_PARTS)


def test_the_engine_is_its_program_api_scheduler_executor_and_driver():
    graph = _graph(ROOT, "pystrads")
    parts = {_engine_part(m) for m in graph} - {None}
    loose = sorted(m for m in graph if m.startswith("pystrads.engine.") and _engine_part(m) not in ENGINE_PARTS)
    assert parts == set(ENGINE_PARTS) and not loose, (sorted(parts), loose)
    assert not _engine_cross_imports(graph), _engine_cross_imports(graph)


def test_the_engine_check_sees_an_executor_importing_the_driver():
    text = "def f():\n    from ..driver.engine import Engine\n"
    known = {"pystrads.engine.driver.engine", "pystrads.engine.executor.worker", "pystrads.engine.program.api"}
    graph = {"pystrads.engine.executor.worker": _imports("pystrads.engine.executor.worker",
                                                         "pystrads/engine/executor/worker.py", text, known),
             "pystrads.engine.driver.engine": {"pystrads.engine.executor.worker", "pystrads.engine.program.api"}}
    assert _engine_cross_imports(graph) == ["pystrads.engine.executor.worker imports pystrads.engine.driver.engine"]


def _cycles(graph):
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("folder", ["pystrads", "jobs"])
def test_no_modules_import_each_other(folder):
    graph = _graph(os.path.join(REPO, folder), folder)
    # a package's __init__ re-exporting its modules is not a circle of the modules' own
    graph = {m: {o for o in imported if not (m.startswith(o + ".") and o.count(".") < m.count("."))}
             for m, imported in graph.items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_checks_see_a_back_arrow_and_a_circle():
    """The checks would fail on what they are meant to catch."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    text = "def f():\n    from ..engine.driver.engine import Engine\n"
    known = {"pystrads.engine.driver.engine", "pystrads.ps.launcher", "pystrads.engine"}
    assert _imports("pystrads.ps.launcher", "pystrads/ps/launcher.py", text, known) == {"pystrads.engine.driver.engine"}
    assert _imports("jobs.a", "jobs/a.py", "def f():\n    from b import g\n", {"jobs.a", "jobs.b"}, "jobs.") \
        == {"jobs.b"}


#: the pystrads.ml modules whose functions Spark's Python workers unpickle (the scan, the records'
#: decoding, the model read, the fold-in): importing one must not import the estimators, and with
#: them all of pyspark.ml (every MLlib algorithm, pandas, scipy: seconds in each new worker)
WORKER_SIDE = ["pystrads.ml._arrow", "pystrads.ml._lda_data", "pystrads.ml._lda_model", "pystrads.ml._linear_input",
               "pystrads.ml._mf_data"]
#: what a worker of a fit unpickles: the engine's executor side and the programs, which must not
#: import the engine's driver side or the shard launcher, nor the in-job coordinator (only the
#: first task of a Connect fit runs it, and imports it then)
ENGINE_WORKER_SIDE = ["pystrads.engine.executor.worker", "pystrads.programs.lda", "pystrads.programs.mf",
                      "pystrads.programs.lasso", "pystrads.programs.logistic", "pystrads.programs.multinomial"]
DRIVER_SIDE = ("pystrads.engine.driver", "pystrads.engine.executor.coordinator", "pystrads.ps.launcher")


def test_worker_side_modules_import_no_estimator_and_no_pyspark_ml():
    import subprocess
    import sys

    code = ("import sys\n" + "".join(f"import {m}\n" for m in WORKER_SIDE) +
            "print(sorted(m for m in sys.modules if m.startswith('pyspark.ml') or m in "
            "('pystrads.ml.lda', 'pystrads.ml.recommendation', 'pystrads.ml.regression', "
            "'pystrads.ml.classification')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_engines_worker_side_imports_nothing_of_its_driver_side():
    import subprocess
    import sys

    code = ("import sys\n" + "".join(f"import {m}\n" for m in ENGINE_WORKER_SIDE + WORKER_SIDE) +
            f"print(sorted(m for m in sys.modules if m.startswith({DRIVER_SIDE!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


#: the packages whose classes compose their parts instead of mixing them in (``ml/`` keeps
#: pyspark's Param mixins, which drop-in estimators need)
NO_MIXINS = ("ps", "engine", "programs")


def _own_bases(cls) -> list:
    """The bases of ``cls`` that are pystrads' own classes."""
    return [b.__name__ for b in cls.__bases__ if b.__module__.split(".")[0] == "pystrads"]


def _mixed(module) -> dict:
    """The classes defined in ``module`` that inherit more than one of pystrads' own classes."""
    import inspect

    return {name: _own_bases(cls) for name, cls in vars(module).items()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and len(_own_bases(cls)) > 1}


@pytest.mark.parametrize("package", NO_MIXINS)
def test_no_class_mixes_in_more_than_one_of_pystrads_classes(package):
    """A class of ``ps/``, ``engine/`` or ``programs/`` inherits at most one of pystrads' own
    classes: a part with state of its own is an object the class holds."""
    import importlib

    mixed = {}
    for module_name, _, _ in _modules(os.path.join(ROOT, package), "pystrads"):
        module = importlib.import_module("pystrads." + module_name)
        mixed.update({f"{module.__name__}.{k}": v for k, v in _mixed(module).items()})
    assert not mixed, mixed


def test_the_mixin_check_sees_a_mixin():
    import types

    from pystrads.engine.program import Program
    from pystrads.ps.state import ShardState

    module = types.ModuleType("pystrads.fake")
    module.Mixed = type("Mixed", (ShardState, Program), {"__module__": "pystrads.fake"})
    module.Single = type("Single", (Program, object), {"__module__": "pystrads.fake"})
    assert _mixed(module) == {"Mixed": ["ShardState", "Program"]}


def test_a_table_handle_has_six_calls():
    """``TableHandle`` is as narrow as ps-lite's worker: reads and writes name rows by ``where``
    and take dense or sparse data by its type, not by a method name or a flag."""
    import inspect

    from pystrads.ps.client import TableHandle

    calls = {n for n, v in vars(TableHandle).items() if not n.startswith("_") and inspect.isfunction(v)}
    assert calls == {"read", "read_entries", "write", "add", "contribute", "fenced"}, sorted(calls)
    for name in calls:
        flags = [p for p in inspect.signature(getattr(TableHandle, name)).parameters
                 if p in ("sparse", "dense", "entries", "nonzero", "as_type", "format")]
        assert not flags, (name, flags)
