"""The package's architecture, as DESIGN.md draws it: dependencies flow one way.

validation/config -> model -> tasks/data/scoring/runs -> training -> capture ->
similarity/ablation -> attribution -> specialization -> figures -> render/report -> analyze ->
explore -> cli. Inside a package, its modules may have layers of their own between the package's
and the next one's (``explore.session`` below ``explore.app``; in training, run_folder below
loop; in specialization, settings -> where -> needed -> whom/verdict -> seeds -> run_analysis
-> battery -> folders/headline).

The import graph is read from the source (``ast``, top-level and function-level imports alike,
so an import moved into a function to dodge a cycle still counts). Known exceptions are listed
below with the reason; the tests fail on a new violation AND on a listed one that is gone, so
the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mhainterp"

# Layer of each top-level module or sub-package (lower = more basic). A module may import
# modules of its own layer or below; a package's __init__ may import its own modules (it gathers
# their API). A fractional layer sits between two others.
LAYERS: dict[str, float] = {
    "validation": 0,
    "errors": 0,  # every public error type but ParameterError (it imports validation only)
    "config": 0,
    "heads": 0,
    "io": 0,
    "stats": 0,
    "runtime": 0,
    # Things registered by name (ablation methods, division axes): a mapping over validation,
    # below both registries' homes (tasks/axes.py, ablation/replacement.py)
    "registry": 0,
    # Markdown / HTML blocks from DataFrames: formatting only (it imports nothing of ours), so
    # the summaries that save their text (sweep, specialization) and the report all use it.
    "render": 0,
    "model": 1,
    "protocol": 1,
    "tasks": 2,
    "scoring": 2,
    "data": 2,
    "runs": 2,
    "provenance": 2,  # saved analyses tied to their weights (reads runs' ANALYSIS_DIR)
    "pretrained": 2,
    "training": 3,
    # Inside training/: leaves (memory estimates, evaluate, which run a folder holds), then the
    # run folder and the checkpoints, then the loop that uses them all.
    "training.memory": 3,
    "training.evaluation": 3,
    "training.identity": 3,
    "training.run_folder": 3.1,
    "training.checkpoints": 3.1,
    "training.loop": 3.2,
    "fast": 3,
    "sweep": 3,
    "capture": 4,
    "similarity": 5,
    "ablation": 5,
    "attribution": 5.5,  # gradient importance and pruning, above the ablation engine it calls
    "specialization": 6,
    # Inside specialization/: the settings (and the nulls' names) as a leaf, one sub-package
    # per question, the verdict beside whom (it reads the division's calls), then over seeds,
    # then the orchestration floor: one run, several runs (battery), folders and the headline.
    "specialization.settings": 6,
    "specialization.nulls": 6,
    "specialization.where": 6.1,
    "specialization.needed": 6.2,
    "specialization.whom": 6.3,
    "specialization.verdict": 6.3,
    "specialization.seeds": 6.4,
    "specialization.run_analysis": 6.5,
    "specialization.battery": 6.6,
    "specialization.folders": 6.7,
    "specialization.headline": 6.7,
    "figures": 7,
    "report": 8,
    # What `mhainterp analyze` and `demo` write: over the library, below the explorer (which
    # reuses the pretrained branch's metric) and the CLI.
    "analyze": 8.5,
    # The explorer, inside: leaves (no state, no ablation), then the one session over the
    # Ablator, then the app that holds the sessions, then the two views of it.
    "explore": 9,
    "explore.wire": 9,
    "explore.memory": 9,
    "explore.runs": 9,
    "explore.results": 9,
    "explore.text": 9,
    "explore.session": 9.2,
    "explore.app": 9.4,
    "explore.server": 9.6,
    "explore.widget": 9.6,
    "cli": 10,
}

# (importer, imported) pairs that break the order today, with why they are tolerated.
KNOWN_BACK_ARROWS: dict[tuple[str, str], str] = {}

# Module cycles tolerated today (the list only shrinks).
KNOWN_CYCLES: list[list[str]] = []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, annotations: bool = False) -> set[str]:
    """Every ``mhainterp.*`` module ``path`` imports, at any depth of the file; with
    ``annotations``, those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if _is_type_checking_block(node) and not annotations:
            node.body = [ast.Pass()]  # annotations only: no dependency at run time
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mhainterp")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mhainterp"):
            found.add(node.module)
    return found


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _graph(*, annotations: bool = False) -> dict[str, set[str]]:
    return {
        _module_name(path): _imports(path, annotations=annotations)
        for path in PACKAGE.rglob("*.py")
        if "assets" not in path.parts
    }


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()


def _layer(module: str) -> float | None:
    """The layer of the longest LAYERS key that starts ``module`` (``training.loop`` before
    ``training``)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return None


def test_every_module_has_a_layer() -> None:
    missing = sorted({m.split(".")[1] for m in _graph() if "." in m and _layer(m) is None})
    assert missing == [], f"add these to LAYERS (DESIGN.md's order): {missing}"


def _upward_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits above the importer."""
    arrows = set()
    for importer, imported in graph.items():
        for target in imported:
            if target.startswith(importer + ".") and _is_package(importer):
                continue  # a package's __init__ gathers its own modules' API
            low, high = _layer(importer), _layer(target)
            if low is not None and high is not None and high > low:
                arrows.add((importer, target))
    return arrows


def test_dependencies_flow_one_way() -> None:
    arrows = _upward_arrows(_graph())
    new = sorted(arrows - set(KNOWN_BACK_ARROWS))
    gone = sorted(set(KNOWN_BACK_ARROWS) - arrows)
    assert new == [], f"imports against DESIGN.md's order: {new}"
    assert gone == [], f"fixed: remove from KNOWN_BACK_ARROWS: {gone}"


def test_annotations_import_nothing_above_them_either() -> None:
    """An import under ``if TYPE_CHECKING:`` costs nothing at run time but is still a
    dependency: of the reader and of the type checker. A module names nothing above its layer,
    not even for an annotation (errors.py once imported training for ``Run``, and heads.py
    protocol for ``HookedModel``: circles that only the annotations closed)."""
    arrows = _upward_arrows(_graph(annotations=True)) - set(KNOWN_BACK_ARROWS)
    assert sorted(arrows) == [], f"annotation-only imports against DESIGN.md's order: {arrows}"


def test_no_import_cycles_between_modules() -> None:
    """No module reaches itself through the imports of other modules (package ``__init__``
    re-exports excluded: importing ``a.b`` runs ``a/__init__`` but does not depend on it)."""
    graph = {m: {t for t in ts if t in _graph_nodes()} for m, ts in _graph().items()}
    exporters = {
        m for m in graph if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()
    }
    edges = {m: ts - exporters for m, ts in graph.items() if m not in exporters}
    cycles = _cycles(edges)
    assert [c for c in cycles if c not in KNOWN_CYCLES] == [], f"import cycles: {cycles}"
    assert [c for c in KNOWN_CYCLES if c not in cycles] == [], "fixed: remove from KNOWN_CYCLES"


def _graph_nodes() -> set[str]:
    return {_module_name(path) for path in PACKAGE.rglob("*.py") if "assets" not in path.parts}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in edges.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(components)


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _exported(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [e.value for e in node.value.elts]  # type: ignore[attr-defined]
    return []


def test_one_home_per_public_name() -> None:
    """A module exports only what it defines; re-exporting is the job of package __init__s
    (which gather their package's API), so every name has one module that owns it."""
    shims = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" or "assets" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        foreign = sorted(set(_exported(tree)) - _defined(tree))
        if foreign:
            shims[_module_name(path)] = foreign
    assert shims == {}, f"re-exported outside a package __init__: {shims}"


def test_no_module_imports_a_private_name_from_another():
    """A name another module needs is public (in its module's ``__all__``, with a docstring):
    ``from mhainterp.x import _y`` couples the importer to an implementation detail. The whole
    package, at any depth of a file (tests may still reach into privates)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            internal = isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("mhainterp")
            )
            if internal:
                private = [a.name for a in node.names if a.name.startswith("_")]
                found += [f"{module}: from {node.module} import {name}" for name in private]
    assert found == [], f"private names imported across modules (make them public): {found}"


# Files that may still raise a plain ValueError, with how many and why. A bad ARGUMENT raises
# mhainterp.validation.ParameterError in its one format ("name=value is invalid: allowed");
# what stays here is a damaged file, an unloaded plug-in, an internal invariant or state.
PLAIN_VALUE_ERRORS = {
    "io.py": (2, "read_json: a damaged JSON file (the message names the file)"),
    "explore/app.py": (1, "a run folder that fails to load (names the folder and the fix)"),
    "fast/stacked_params.py": (1, "the flat parameter layout disagrees with itself (invariant)"),
    "specialization/where/roles.py": (1, "output_ratio asked of sums captured without outputs"),
    "tasks/registry.py": (2, "a saved folder names a task whose module is not loaded"),
}


def test_bad_arguments_raise_parameter_error_not_plain_value_error() -> None:
    """Every ``raise ValueError(`` outside validation.py is on the allow-list above: a new one
    is a bad argument that should go through mhainterp.validation (one message format)."""
    counts = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        n = path.read_text().count("raise ValueError(")
        if n and relative != "validation.py":
            counts[relative] = n
    allowed = {name: n for name, (n, _) in PLAIN_VALUE_ERRORS.items()}
    over = {name: n for name, n in counts.items() if n > allowed.get(name, 0)}
    assert over == {}, f"plain ValueError for what may be a bad argument (use validation): {over}"
    fewer = {name: n for name, n in allowed.items() if counts.get(name, 0) < n}
    assert fewer == {}, (
        f"converted: lower these in PLAIN_VALUE_ERRORS (the list only shrinks): {fewer}"
    )


MAY_IMPORT = re.compile(r"May import \(.*?\):(?P<names>.*?)\.\s*$", re.S)


def _part(package: str, target: str) -> str:
    """How a package's "May import" names ``target``: its top-level part, and inside
    specialization/ the sub-package (``specialization.settings``)."""
    parts = target.split(".")[1:]
    inside = package.startswith("mhainterp.specialization") and parts[0] == "specialization"
    return ".".join(parts[:2] if inside and len(parts) > 1 else parts[:1])


def test_each_package_says_what_it_may_import_and_it_is_true() -> None:
    """Each sub-package's ``__init__`` docstring ends with "May import (...): ``a``, ``b``."
    naming exactly what its modules import from outside it (annotation-only imports included),
    each at or below its own layer, so a reader learns the package's place without reading
    its imports, and the sentence cannot go stale."""
    graph = _graph(annotations=True)
    wrong = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = _module_name(init)
        if "assets" in init.parts or package == "mhainterp":
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = MAY_IMPORT.search(docstring)
        if said is None:
            wrong[package] = "no 'May import (...): ...' paragraph at the end of its docstring"
            continue
        named = set(re.findall(r"``([\w.]+)``", said.group("names")))
        used = {
            _part(package, target)
            for module, targets in graph.items()
            if module == package or module.startswith(package + ".")
            for target in targets
            if not (target == package or target.startswith(package + "."))
        }
        above = sorted(n for n in named if (_layer(f"mhainterp.{n}") or 0) > _layer(package))
        if named != used or above:
            wrong[package] = {"unsaid": sorted(used - named), "unused": sorted(named - used)}
            wrong[package]["above its layer"] = above
    assert wrong == {}, wrong
