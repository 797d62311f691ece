"""A researcher's first hour (issue 19 items 3, 4, 7, 10, 11, 16): user tasks checked once,
every option within a documented range, help without torch, one ``--n-eval`` default.

Faults run the installed ``mhainterp`` command in a subprocess, as a user would; those that
import torch are marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mhainterp.cli import build_parser
from mhainterp.cli import static as cli_static
from mhainterp.cli.tasks import describe_task, first_sentence
from mhainterp.tasks import (
    BUILTIN_TASKS,
    InvalidTaskError,
    Task,
    TaskModuleError,
    get_task,
    list_tasks,
    load_entry_point_tasks,
    load_task_module,
    plugins,
    register_task,
    unregister_task,
)

ROOT = Path(__file__).resolve().parent.parent
MHAINTERP = str(Path(sys.executable).parent / "mhainterp")
MY_TASK = ROOT / "analysis" / "my_task.py"


def run_command(*args: str, cwd: Path | None = None, timeout: float = 300) -> tuple[int, str, str]:
    """``mhainterp ARGS`` in a subprocess: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "MHAINTERP_DEBUG"}
    done = subprocess.run(
        [MHAINTERP, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )
    return done.returncode, done.stdout, done.stderr


def one_line_error(code: int, err: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ----- item 3: a user task is checked once, when registered or loaded ---------------------------
TASK_HEADER = """
import torch
from mhainterp.tasks import Task, register_task


class Broken(Task):
    name = "broken"
    causal = True

    @property
    def d_vocab_out(self):
        return self.d_vocab

    def compute_targets(self, tokens, padding_mask):
        return tokens, padding_mask

    def compute_relations(self, tokens, padding_mask):
        n, pos = tokens.shape
        return {"self": torch.eye(pos).expand(n, pos, pos)}
"""

BROKEN_TASKS = {
    "list_targets": (
        "    def compute_targets(self, tokens, padding_mask):\n"
        "        return tokens.tolist(), padding_mask\n",
        "task 'broken': compute_targets is invalid: it must return (targets, mask) as torch "
        "tensors; its targets is a list",
    ),
    "raising_d_vocab_out": (
        "    @property\n    def d_vocab_out(self):\n        raise RuntimeError('not yet')\n",
        "task 'broken': d_vocab_out is invalid: reading it raised RuntimeError: not yet",
    ),
    "float_targets": (
        "    def compute_targets(self, tokens, padding_mask):\n"
        "        return torch.full(tokens.shape, 2.5), padding_mask\n",
        "task 'broken': compute_targets is invalid: targets must be class ids, an integer tensor; "
        "got torch.float32 (values such as [2.5, 2.5, 2.5]); convert with .long() after rounding",
    ),
    "raising_targets": (
        "    def compute_targets(self, tokens, padding_mask):\n        return 1 / 0\n",
        "task 'broken': compute_targets is invalid: it raised ZeroDivisionError: division by zero",
    ),
    "relation_out_of_range": (
        "    def compute_relations(self, tokens, padding_mask):\n"
        "        n, pos = tokens.shape\n"
        "        return {'self': 2 * torch.eye(pos).expand(n, pos, pos)}\n",
        "task 'broken': compute_relations is invalid: relation 'self' must hold values in [0, 1], "
        "got [0.0, 2.0]",
    ),
}


def broken_task_source(fault: str) -> str:
    """A task module whose ``Broken`` task has one fault, then registers it."""
    override, _ = BROKEN_TASKS[fault]
    subclass = f"\n\nclass Faulty(Broken):\n{override}\n\nregister_task('broken', Faulty)\n"
    return TASK_HEADER + subclass


@pytest.fixture
def clean_registry():
    """Forget the task modules and the ``broken`` task a test loaded."""
    yield
    if "broken" in list_tasks():
        unregister_task("broken")
    plugins._loaded.clear()


@pytest.mark.parametrize("fault", sorted(BROKEN_TASKS))
def test_a_broken_task_is_refused_at_registration_naming_task_and_member(
    fault, tmp_path, clean_registry
):
    path = tmp_path / f"{fault}.py"
    path.write_text(broken_task_source(fault))
    with pytest.raises(InvalidTaskError) as error:
        load_task_module(path)
    assert str(error.value) == BROKEN_TASKS[fault][1]
    assert "broken" not in list_tasks()  # refused: nothing was registered


def test_the_unbroken_task_passes_the_same_check(tmp_path, clean_registry):
    path = tmp_path / "fine.py"
    path.write_text(TASK_HEADER + "\nregister_task('broken', Broken)\n")
    assert load_task_module(path) == ["broken"]
    assert get_task("broken", seq_len=3).targets_for(torch.tensor([[2, 0, 1]]))[0].tolist() == [
        [2, 0, 1]
    ]


def test_a_factory_needing_parameters_is_checked_when_first_built(clean_registry):
    class NeedsWidth(Task):
        name = "broken"

        def __init__(self, width, seq_len=4, d_vocab=3, min_len=None):
            super().__init__(seq_len, d_vocab, min_len)
            self.width = width

        @property
        def d_vocab_out(self):
            return self.width  # too few classes for the targets below when width < d_vocab

        def compute_targets(self, tokens, padding_mask):
            return tokens, padding_mask

        def compute_relations(self, tokens, padding_mask):
            return {}

    register_task("broken", NeedsWidth)  # cannot be built without width: checked later
    assert get_task("broken", width=3).d_vocab_out == 3
    with pytest.raises(
        InvalidTaskError, match=r"task 'broken': compute_targets is invalid: .*\[0, d"
    ):
        get_task("broken", width=1)


def test_a_task_module_calling_sys_exit_is_one_error_naming_it(tmp_path, clean_registry):
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(TaskModuleError) as error:
        load_task_module(path)
    assert (
        str(error.value)
        == f"task module {str(path)!r} failed: it called sys.exit(3) while being imported"
    )


def test_an_entry_point_with_a_broken_task_is_skipped_naming_the_member(
    tmp_path, monkeypatch, clean_registry
):
    dist = tmp_path / "mylab-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mhainterp.tasks]\nbroken = mylab_broken:Faulty\n")
    source = broken_task_source("float_targets").replace("register_task('broken', Faulty)", "")
    (tmp_path / "mylab_broken.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(
        UserWarning, match=r"skipped task entry point 'broken'.*package 'mylab'"
    ) as w:
        assert load_entry_point_tasks() == []
    assert "compute_targets is invalid: targets must be class ids" in str(w[0].message)
    assert "broken" not in list_tasks()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["list_targets", "raising_d_vocab_out", "float_targets"])
def test_cli_refuses_a_broken_user_task_in_one_line(fault, tmp_path):
    path = tmp_path / f"{fault}.py"
    path.write_text(broken_task_source(fault))
    code, _, err = run_command(
        "train", "--task-module", str(path), "--task", "broken", "--out", str(tmp_path / "run")
    )
    assert one_line_error(code, err) == f"mhainterp train: error: {BROKEN_TASKS[fault][1]}"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_task_module_calling_sys_exit_exits_2_naming_it(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(3)\n")
    code, _, err = run_command("tasks", "--task-module", str(path))
    assert one_line_error(code, err) == (
        f"mhainterp tasks: error: task module {str(path)!r} failed: it called sys.exit(3) "
        "while being imported"
    )


# ----- item 2: a relation covering the whole causal prefix (its effect is NaN) ------------------
MAJORITY_TASK = """
import torch
from mhainterp.tasks import Task, register_task


class MajoritySoFar(Task):
    name = "majority"
    causal = True

    @property
    def d_vocab_out(self):
        return 2

    def compute_targets(self, tokens, padding_mask):
        ones = (tokens == 1).long().cumsum(-1)
        return (2 * ones > torch.arange(1, tokens.shape[1] + 1)).long(), padding_mask

    def compute_relations(self, tokens, padding_mask):
        n, pos = tokens.shape
        return {"prefix": torch.tril(torch.ones(pos, pos)).expand(n, pos, pos).clone()}


register_task("majority", MajoritySoFar)
"""


@pytest.mark.slow
def test_specialize_and_report_a_user_task_whose_relation_covers_the_prefix(tmp_path):
    """The natural template of "majority token so far" covers every visible key: chance is 1,
    its effect NaN, and the sweep's consistency step used to raise KeyError ['prefix']."""
    module = tmp_path / "majority.py"
    module.write_text(MAJORITY_TASK)
    sweep, task = tmp_path / "maj", ["--task-module", str(module)]
    code, _, err = run_command(
        "sweep", *task, "--task", "majority", "--task-param", "seq_len=6",
        "--task-param", "d_vocab=2", "--n-heads", "1,2", "--seeds", "0,1", "--d-model", "8",
        "--steps", "20", "--batch-size", "16", "--n-eval", "32", "--executor", "local",
        "--quiet", "--out", str(sweep),
    )  # fmt: skip
    assert code == 0, err
    for command in ("specialize", "report"):
        code, _, err = run_command(command, str(sweep), *task, "--n-eval", "32", "--quiet")
        assert code == 0 and "Traceback" not in err, (command, err)
    roles = (sweep / "specialization_sweep_roles.csv").read_text().splitlines()
    prefix = [line for line in roles if ",prefix,True," in line]
    assert len(prefix) == 6  # 1 + 2 heads x 2 seeds, each kept with its undefined effect
    assert "## Findings" in (sweep / "report.md").read_text()


# ----- item 4: a minimal user task, in analysis/my_task.py and in the README --------------------
def test_the_example_task_copies_the_first_token(clean_registry):
    try:
        assert load_task_module(MY_TASK) == ["first_token"]
        task = get_task("first_token", seq_len=4, d_vocab=5)
        targets, mask = task.targets_for(torch.tensor([[3, 1, 4, 1]]))
        assert targets.tolist() == [[3, 3, 3, 3]] and mask.tolist() == [[True] * 4]
        first = task.relations(torch.tensor([[3, 1, 4, 1]]))["first"][0]
        assert first.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 4
    finally:
        if "first_token" in list_tasks():
            unregister_task("first_token")


@pytest.mark.slow
def test_the_example_task_trains_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    code, stdout, err = run_command(
        "train", "--task-module", str(MY_TASK), "--task", "first_token",
        "--task-param", "seq_len=6", "--task-param", "d_vocab=4", "--n-heads", "2",
        "--d-model", "8", "--steps", "3", "--batch-size", "4", "--n-eval", "8", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert "trained first_token h=2 seed=0" in stdout
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == {
        "name": "first_token",
        "params": {"seq_len": 6, "d_vocab": 4, "min_len": 6},
        "module": str(MY_TASK),
    }


README_MARKER = "<!-- user-task-example -->"


def readme_task_example() -> str | None:
    """The fenced code block after the README's ``<!-- user-task-example -->`` line, or None."""
    text = (ROOT / "README.md").read_text()
    if README_MARKER not in text:
        return None
    after = text.split(README_MARKER, 1)[1]
    block = re.search(r"```(?:python)?\n(.*?)```", after, re.DOTALL)
    assert block, f"README.md: no fenced code block after {README_MARKER}"
    return textwrap.dedent(block.group(1))


def test_the_readmes_user_task_example_runs(tmp_path, monkeypatch):
    source = readme_task_example()
    if source is None:
        pytest.skip("README block not yet added")
    before = set(list_tasks())
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(source, "README.md (user-task example)", "exec"), {"__name__": "readme"})
        added = set(list_tasks()) - before
        assert added, "the README's example registers no task"
        for name in added:  # each passes the Task contract and labels a batch
            assert len(get_task(name).sample(2, torch.Generator().manual_seed(0))) == 2
    finally:
        for name in set(list_tasks()) - before:
            unregister_task(name)


# ----- item 7: every option within its documented range -----------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["train", "--seed", str(2**64), "--out", "x"],
            f"mhainterp train: error: --seed={2**64} is invalid: an integer >= 0 and <= "
            f"{2**63 - 1} (2**63 - 1)",
        ),
        (
            ["train", "--seed", "-1", "--out", "x"],
            f"mhainterp train: error: --seed=-1 is invalid: an integer >= 0 and <= {2**63 - 1} "
            "(2**63 - 1)",
        ),
        (
            ["sweep", "--seeds", f"0,{2**63}", "--out", "x"],
            f"mhainterp sweep: error: --seeds='0,{2**63}' is invalid: distinct integers >= 0 and "
            f"<= {2**63 - 1}, comma-separated",
        ),
        (
            ["demo", "--steps", "0"],
            "mhainterp demo: error: --steps=0 is invalid: an integer >= 1 and <= 2147483647",
        ),
        (
            ["train", "--batch-size", str(2**40), "--out", "x"],
            f"mhainterp train: error: --batch-size={2**40} is invalid: an integer >= 1 and <= "
            "2147483647",
        ),
        (
            ["train", "--lr", "nan", "--out", "x"],
            "mhainterp train: error: --lr=nan is invalid: a finite number > 0",
        ),
        (
            ["analyze", "x", "--n-eval", "0"],
            "mhainterp analyze: error: --n-eval=0 is invalid: an integer >= 1 and <= 2147483647",
        ),
        (
            ["specialize", "x", "--alpha", "1.5"],
            "mhainterp specialize: error: --alpha=1.5 is invalid: a finite number > 0 and < 1",
        ),
        (
            ["ablate", "x", "--method", "avg"],
            "mhainterp ablate: error: --method='avg' is invalid: one of 'zero', 'mean', 'resample'",
        ),
        (
            ["explore", "x", "--port", "70000"],
            "mhainterp explore: error: --port=70000 is invalid: an integer >= 0 and <= 65535 "
            "(0: any free port)",
        ),
        (
            ["explore", "x", "--port", "-1"],
            "mhainterp explore: error: --port=-1 is invalid: an integer >= 0 and <= 65535 "
            "(0: any free port)",
        ),
        (
            ["explore", "x", "--n-eval", "0"],
            "mhainterp explore: error: --n-eval=0 is invalid: an integer >= 1 and <= 2147483647",
        ),
        (
            ["train", "--steps", "many", "--out", "x"],
            "mhainterp train: error: argument --steps: invalid int value: 'many' (see mhainterp "
            "train --help)",
        ),
    ],
)
def test_out_of_range_options_are_one_line_exit_2(args, message, tmp_path):
    code, _, err = run_command(*args, cwd=tmp_path)
    assert one_line_error(code, err) == message
    assert not (tmp_path / "x").exists()


def test_ray_executor_without_ray_says_how_to_install_it(tmp_path):
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    for command in (["sweep", "--out", "x"], ["demo"]):
        code, _, err = run_command(*command, "--executor", "ray", cwd=tmp_path)
        line = one_line_error(code, err)
        assert "--executor='ray' is invalid" in line and "pip install -e .[ray]" in line
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["1e20", "100000000000000000000"])
def test_a_huge_task_parameter_is_refused_by_the_task(value, tmp_path):
    code, _, err = run_command(
        "train", "--task-param", f"seq_len={value}", "--out", "x", cwd=tmp_path
    )
    shown = "1e+20" if "e" in value else value
    assert one_line_error(code, err) == (
        f"mhainterp train: error: seq_len={shown} is invalid: an integer >= 2 and <= 65536"
    )


def test_check_port_is_the_explorer_ports_range():
    from mhainterp.validation import ParameterError, check_port

    assert check_port("--port", 0) == 0 and check_port("--port", 65535) == 65535
    for port in (-1, 65536, 70000):
        with pytest.raises(ParameterError, match=rf"--port={port} is invalid: an integer >= 0"):
            check_port("--port", port)


# ----- item 10: train() picks its threads like the sweep executor's workers ---------------------
def test_train_uses_one_thread_and_restores_the_setting():
    from mhainterp import TrainConfig, build_model, train

    seen: list[int] = []

    class Watched(type(get_task("reverse"))):
        def sample_tokens(self, n, lengths, generator):
            seen.append(torch.get_num_threads())  # read inside the training loop
            return super().sample_tokens(n, lengths, generator)

    task = Watched(seq_len=4, d_vocab=3)
    config = TrainConfig(steps=2, batch_size=4, n_eval=4, log_every=1)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(build_model(task, n_heads=1, d_model=4), task, config, progress=False)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2  # 2 steps, then evaluation
        seen.clear()
        task = Watched(seq_len=4, d_vocab=3)  # a fresh task: the evaluation set is built again
        train(build_model(task, n_heads=1, d_model=4), task, config, progress=False, threads=0)
        assert seen == [2, 2, 2]
    finally:
        torch.set_num_threads(previous)


# ----- item 11: help and the task list import no torch ------------------------------------------
NO_TORCH = """
import sys
from mhainterp.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:
    code = done.code
heavy = sorted(m for m in ("torch", "transformer_lens", "pandas") if m in sys.modules)
print("HEAVY", ",".join(heavy), "CODE", code)
"""

COMMANDS = ["tasks", "train", "sweep", "analyze", "demo", "ablate", "specialize", "report"]


@pytest.mark.parametrize(
    "args", [["--help"], ["tasks"], *([command, "--help"] for command in COMMANDS)]
)
def test_help_and_task_listing_import_no_torch(args):
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1] == "HEAVY  CODE 0", done.stderr


def test_static_mirrors_equal_their_library_homes():
    from mhainterp.ablation import METHODS
    from mhainterp.analyze import DEMO_STEPS, GRIDS
    from mhainterp.config import DEFAULT_N_EVAL, TrainConfig
    from mhainterp.specialization import SpecializationSettings
    from mhainterp.stats import CORRECTIONS
    from mhainterp.tasks import AXES, ENTRY_POINT_GROUP

    assert cli_static.DEFAULT_N_EVAL == DEFAULT_N_EVAL
    assert cli_static.DEMO_STEPS == DEMO_STEPS
    assert GRIDS["demo"].seeds == cli_static.DEMO_SEEDS
    # the registries' built-ins, names, help and order (the default of specialize --by)
    assert list(cli_static.DIVISION_AXES.items()) == [(n, a.help) for n, a in AXES.items()]
    assert list(cli_static.ABLATION_METHODS.items()) == [(n, m.help) for n, m in METHODS.items()]
    assert cli_static.CORRECTIONS == CORRECTIONS
    assert cli_static.ENTRY_POINT_GROUP == ENTRY_POINT_GROUP
    train = TrainConfig()
    assert {k: getattr(train, k) for k in cli_static.TRAIN_DEFAULTS} == cli_static.TRAIN_DEFAULTS
    settings = SpecializationSettings()
    assert {
        k: getattr(settings, k) for k in cli_static.SPECIALIZATION_DEFAULTS
    } == cli_static.SPECIALIZATION_DEFAULTS


def test_the_static_task_list_equals_the_registry():
    assert sorted(cli_static.BUILTIN_TASKS) == sorted(cls.name for cls in BUILTIN_TASKS)
    for name, entry in cli_static.BUILTIN_TASKS.items():
        assert describe_task(get_task(name)) == entry, name


def test_task_descriptions_are_whole_sentences_without_markup():
    doc = """Copy ``x``: see :class:`~mhainterp.tasks.Task` (e.g. ``t - 1``). Second.

    More."""
    assert first_sentence(doc) == "Copy x: see Task (e.g. t - 1)."
    assert first_sentence("No full stop\nacross lines\n\nNext paragraph.") == (
        "No full stop across lines"
    )
    for entry in cli_static.BUILTIN_TASKS.values():
        assert entry["summary"].endswith(".") and "``" not in entry["summary"]
        assert ":class:" not in entry["summary"]


def test_tasks_prints_each_summary_whole(capsys):
    from mhainterp.cli import main

    assert main(["tasks"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for entry in cli_static.BUILTIN_TASKS.values():
        assert entry["summary"] in out


# ----- item 16: help that is right, one --n-eval default ----------------------------------------
def _subparsers() -> dict[str, object]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)


def test_n_eval_has_one_default_in_every_command():
    from mhainterp.config import DEFAULT_N_EVAL

    defaults = {
        name: action.default
        for name, sub in _subparsers().items()
        for action in sub._actions
        if "--n-eval" in action.option_strings
    }
    assert set(defaults) >= {"train", "sweep", "analyze", "ablate", "specialize", "report"}
    assert set(defaults.values()) == {DEFAULT_N_EVAL}, defaults


def test_training_options_have_help_with_their_default():
    train = _subparsers()["train"]
    group = next(g for g in train._action_groups if g.title == "training")
    for action in group._group_actions:
        assert action.help, action.dest
        if action.dest != "quiet":
            assert "default" in action.help, action.dest
    help_text = " ".join(train.format_help().split())
    assert "optimiser steps (an integer >= 1, default 2000)" in help_text
    assert "peak AdamW learning rate (a number > 0, default 0.003)" in help_text


def test_ablate_help_examples_name_folders_a_demo_writes():
    from mhainterp.config import SweepConfig
    from mhainterp.sweep import plan_sweep

    specs = plan_sweep(SweepConfig(task="count_previous", n_heads=[4], seeds=[0]),
                       "runs/quickstart/count_previous")  # fmt: skip
    run_dir = Path(specs[0].run_dir).as_posix()
    assert run_dir == "runs/quickstart/count_previous/runs/h4_seed0"
    examples = re.findall(r"mhainterp ablate (\S+)", _subparsers()["ablate"].description)
    assert examples and set(examples) == {run_dir}
