"""Every cross-reference in the library's docstrings names something that exists.

Sphinx roles (``:func:`...```, ``:class:``, ``:mod:``, ``:meth:``, ``:data:``, ``:attr:``,
``:exc:``) are how a docstring points a reader elsewhere; one that names nothing sends the
reader nowhere. A target is resolved as Sphinx would from the module it is written in: a dotted
path from the top (``mhainterp.x.y``), or a name visible in that module (defined, imported, or a
method of a class there, annotation-only imports included), a name of the public API
(``mhainterp.__all__``), or, with a leading dot, a name ending so anywhere in the package.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mhainterp"
ROLE = re.compile(r":(func|class|mod|meth|data|attr|exc|obj):`(?:[^`<]*<)?~?([^`>]+)>?`")
OUTSIDE = (
    "torch",
    "transformer_lens",
    "pandas",
    "numpy",
    "sklearn",
    "scipy",
    "seaborn",
    "matplotlib",
    "tqdm",
    "jaxtyping",
    "ray",
    "transformers",
    "starlette",
    "uvicorn",
)


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "assets" in path.parts or path.name == "__main__.py":
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _docstrings(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text
        # attribute docstrings: a string expression right after an assignment
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for before, after in itertools.pairwise(body):
                if (
                    isinstance(before, (ast.Assign, ast.AnnAssign))
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    yield after.value.value


def _resolve_dotted(target: str) -> bool:
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr) if not isinstance(obj, dict) else obj[attr]
        except (AttributeError, KeyError):
            return _class_field(obj, parts[cut:])
        return True
    return False


def _class_field(owner, rest: list[str]) -> bool:
    """``Class.field`` of a dataclass field or an annotated attribute (no class attribute)."""
    if len(rest) != 1 and not inspect.isclass(owner):
        return False
    name = rest[-1]
    return inspect.isclass(owner) and any(
        name in getattr(klass, "__annotations__", {}) for klass in owner.__mro__
    )


def _imported(module) -> dict[str, str]:
    """Names the module imports, annotation-only ones (``if TYPE_CHECKING:``) included, with
    the dotted path each stands for."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    package = (
        module.__name__
        if Path(inspect.getfile(module)).name == "__init__.py"
        else (module.__name__.rpartition(".")[0])
    )
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name
    return names


def _resolves(module, target: str) -> bool:
    target = re.sub(r"\s+", "", target).rstrip("()")
    if target.startswith("mhainterp"):
        return _resolve_dotted(target)
    if target.split(".")[0] in OUTSIDE:
        return True  # another project's reference: its own docs resolve it
    if target.startswith("."):  # Sphinx: a name ending so anywhere in the package
        return any(_resolve_dotted(f"{other}{target}") for other in _modules())
    first, *rest = target.split(".")
    if hasattr(builtins, first):
        return True
    namespace = vars(module)
    if first in namespace:
        return _resolve_dotted(f"{module.__name__}.{target}") or rest == []
    imported = _imported(module)
    if first in imported:
        path = imported[first]
        return path.split(".")[0] in OUTSIDE or _resolve_dotted(".".join([path, *rest]))
    if first in importlib.import_module("mhainterp").__all__:  # the public API, by its name
        return _resolve_dotted(f"mhainterp.{target}")
    # a method or attribute of a class defined in this module (``:meth:`name```)
    return any(
        inspect.isclass(value)
        and value.__module__ == module.__name__
        and (hasattr(value, first) or _class_field(value, [first]))
        for value in namespace.values()
    )


@pytest.mark.parametrize("name", _modules())
def test_every_docstring_reference_names_something(name: str) -> None:
    module = importlib.import_module(name)
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    broken = sorted(
        {
            f":{role}:`{target}`"
            for text in _docstrings(tree)
            for role, target in ROLE.findall(text)
            if not _resolves(module, target)
        }
    )
    assert broken == [], f"{name}: references that name nothing: {broken}"


def test_a_reference_to_nothing_is_found() -> None:
    """The check can fail: a made-up name is not resolved, a real one is."""
    module = importlib.import_module("mhainterp.scoring")
    assert not _resolves(module, "no_such_function")
    assert not _resolves(module, "mhainterp.scoring.no_such_function")
    assert _resolves(module, "mhainterp.scoring.Totals")
