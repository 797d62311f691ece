"""The package's top level: every public name resolves, and importing it is light."""

import importlib
import inspect
import subprocess
import sys

import mhainterp


def test_every_public_name_resolves_to_its_module():
    assert sorted(mhainterp.__all__) == sorted(mhainterp._EXPORTS)
    for name in mhainterp.__all__:
        module = importlib.import_module(mhainterp._EXPORTS[name])
        if name == "explore":  # the subpackage itself, callable as its function
            assert mhainterp.explore is module and callable(module)
            assert module.__signature__ == inspect.signature(module.explore)
        else:
            assert getattr(mhainterp, name) is getattr(module, name), name
    assert set(mhainterp.__all__) <= set(dir(mhainterp))


def test_importing_the_package_and_the_command_loads_no_torch():
    # The command builds its parser (and imports torch) inside main, where Ctrl-C is handled.
    code = "import sys, mhainterp, mhainterp.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_static_imports_are_the_lazy_exports():
    """``__all__`` is derived from ``_EXPORTS``; the ``TYPE_CHECKING`` block that static tools
    read must name the same names from the same modules, or an IDE sees another API."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(mhainterp.__file__).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    ]
    static = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert static == mhainterp._EXPORTS
    assert mhainterp.__all__ == sorted(mhainterp._EXPORTS)
