"""Every command of the README's shell blocks works as written on this checkout, once `.venv`
is activated as the Quick start says (issue 33 item 8: after ``make demo`` the commands
failed with ``mhainterp: command not found``; nothing said where they run).

The ``mhainterp`` commands are parsed by the command's own parser (every sub-command, option
and value is checked, nothing is run); ``make`` targets exist in the Makefile; scripts and
files the blocks name exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from mhainterp.cli import build_parser

ROOT = Path(__file__).parent.parent
ACTIVATE = ". .venv/bin/activate"


def shell_lines() -> list[tuple[int, str]]:
    """``(line number, command)`` of every line of the README's ```bash blocks, comments cut."""
    lines, inside = [], False
    for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), start=1):
        if line.startswith("```"):
            inside = line.strip() == "```bash" and not inside
            continue
        command = line.split(" #", 1)[0].strip()
        if inside and command:
            lines.append((number, command))
    return lines


def commands(program: str) -> list[tuple[int, list[str]]]:
    """The README's shell commands of ``program`` (bare or under ``.venv/bin/``), as argv."""
    found = []
    for number, line in shell_lines():
        for part in line.split("&&"):
            argv = shlex.split(part)
            if argv and argv[0] in (program, f".venv/bin/{program}"):
                found.append((number, argv[1:]))
    return found


def test_the_quick_start_says_to_activate_the_venv_before_any_bare_command():
    lines = shell_lines()
    activate = next((n for n, line in lines if line == ACTIVATE), None)
    assert activate is not None, f"no `{ACTIVATE}` line in a README shell block"
    bare = [n for n, line in lines if line.split()[0] in ("mhainterp", "python", "pip")]
    assert bare and min(bare) > activate  # every bare command comes after it
    assert (ROOT / ".venv" / "bin" / "activate").is_file() or not (ROOT / ".venv").exists()


@pytest.mark.parametrize(("line", "argv"), commands("mhainterp"), ids=lambda x: str(x))
def test_every_mhainterp_command_parses(line, argv):
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:
        pytest.fail(f"README.md:{line}: mhainterp {' '.join(argv)} exits {stop.code}")
    assert callable(getattr(args, "func", None)), f"README.md:{line}: no sub-command"


def test_every_make_target_and_script_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for line, argv in commands("make"):
        assert set(argv) <= targets, f"README.md:{line}: make {' '.join(argv)}"
    for line, argv in commands("python"):
        assert (ROOT / argv[0]).is_file(), f"README.md:{line}: {argv[0]}"
    scripts = [line.split()[0] for _, line in shell_lines() if line.startswith(".ci/")]
    assert all((ROOT / script).is_file() for script in scripts), scripts
