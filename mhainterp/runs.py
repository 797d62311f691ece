"""Folder kinds, discovery and path resolution: the one place that knows them.

Three kinds of folder hold results (DESIGN.md, "Results and files")::

    run     config.json  model.safetensors  metrics.csv  eval.json (written last)  analysis/
    sweep   sweep.json  results.csv  runs/h{h}_seed{s}/ (run folders)
    study   a folder whose sub-folders are sweeps (what ``mhainterp demo`` writes)

Rules every reader follows through this module:

- A path inside a table is relative to the folder that holds the table: ``runs/h4_seed0`` in
  ``rev/results.csv`` means ``rev/runs/h4_seed0``, wherever the command runs. The current
  directory is never consulted (:func:`resolve_run_dir`).
- Discovery follows symbolic links (a linked run folder counts; a link cycle is visited once).
- A damaged file raises :class:`RunFolderError` with one line naming the file and what is wrong;
  a missing one raises ``FileNotFoundError``. A killed write never leaves a damaged file (the
  writes are atomic, :mod:`mhainterp.io`), so a damaged file is refused rather than redone.
  Its message says how to retrain the run (:func:`retrain_advice`): the folder is moved out
  first, as the command that made it would refuse the same files again.
- A run that diverged (``eval.json`` status ``"diverged"``) keeps its last good weights, not a
  trained model: every reader refuses it in one line saying so (:func:`check_not_diverged`).
- A saved analysis belongs to the weights it was computed from (:mod:`mhainterp.provenance`:
  ``analysis/source.json`` records their SHA-256; results of other weights are set aside).

Old folders load through one migration, applied by every reader: :func:`migrate_config`
(``config.json``), :func:`migrate_settings` (saved specialization settings) and
:func:`migrate_results` (saved tables); :func:`migrate_folder` rewrites a folder in the current
format on disk. A saved analysis result that lacks a column the current version writes is not
guessed at: :func:`read_result_table` refuses it (:class:`OutdatedResultError`), and the readers
that reuse saved results recompute it. Nothing else reads an old format.

Example:
    >>> folder_kind("runs/quickstart")  # doctest: +SKIP
    'study'
    >>> [p.name for p in find_runs("runs/quickstart/reverse")][:2]  # doctest: +SKIP
    ['h1_seed0', 'h1_seed1']
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from mhainterp.errors import OutdatedResultError, RunFolderError
from mhainterp.io import read_json, write_csv, write_json
from mhainterp.validation import check_option, invalid

if TYPE_CHECKING:  # annotations only: reading a run folder needs neither torch nor the model
    from mhainterp.model import HookedMHATransformer

__all__ = [
    "check_free_folder",
    "HEAD_KEYS",
    "lead_with_head",
    "CHECKPOINT_FILE",
    "ANALYSIS_DIR",
    "PRETRAINED_ANALYSIS_FILE",
    "PRETRAINED_VERDICT_FILE",
    "RESULTS_FILE",
    "RUN_FILES",
    "SWEEP_FILE",
    "FolderKind",
    "METRIC_COLUMNS",
    "WEIGHT_DTYPES",
    "check_dtype_name",
    "check_metrics",
    "check_not_diverged",
    "check_tensors",
    "read_result_table",
    "read_saved_meta",
    "read_table",
    "find_runs",
    "folder_kind",
    "is_finished_run",
    "migrate_config",
    "migrate_folder",
    "migrate_results",
    "migrate_settings",
    "read_eval",
    "read_results",
    "relative_run_dir",
    "resolve_run_dir",
    "retrain_advice",
    "run_status",
    "sweep_folders",
    "sweep_of_run",
    "weights_digest",
]

PRETRAINED_VERDICT_FILE = "pretrained_verdict.json"
"""What marks ``mhainterp specialize --model``'s folder, written last."""
PRETRAINED_ANALYSIS_FILE = "categories.csv"
"""What marks ``mhainterp analyze --model``'s folder (no other command writes it at the top)."""
RUN_FILES = ("config.json", "model.safetensors", "metrics.csv", "eval.json")
CHECKPOINT_FILE = "checkpoint.pt"
"""An unfinished run's training state (weights, optimizer, data generator, curve so far), which
``train`` resumes from; removed when the run finishes."""
SWEEP_FILE = "sweep.json"
RESULTS_FILE = "results.csv"
ANALYSIS_DIR = "analysis"

FolderKind = Literal["run", "sweep", "study"]


# ----- eval.json and the state of a run ---------------------------------------------------------
_FINISHED_NUMBERS = ("loss", "accuracy", "final_train_loss")


def read_eval(run_dir: str | os.PathLike[str], require: tuple[str, ...] = ()) -> dict[str, Any]:
    """``run_dir/eval.json``, checked: a JSON object; its ``status`` (when there) a string; a
    finished run's ``loss`` and ``accuracy`` numbers (accuracy in [0, 1]), and
    ``final_train_loss`` too where the run recorded it or ``require`` names it (a run that
    :func:`~mhainterp.training.train` wrote always has it; one saved by hand may not).

    Raises:
        FileNotFoundError: there is no eval.json.
        RunFolderError: it is damaged (the message names the file and the key).

    Example:
        >>> read_eval("runs/rev_h4")["accuracy"]  # doctest: +SKIP
        0.97
    """
    path = Path(run_dir) / "eval.json"
    retrain = retrain_advice(run_dir)
    try:
        saved = read_json(path)
    except ValueError as error:
        raise RunFolderError(f"{error}; {retrain}") from None
    if not isinstance(saved, dict):
        raise RunFolderError(
            f"{path} is not a JSON object of metrics (it holds a {type(saved).__name__}); {retrain}"
        )
    if not isinstance(saved.get("status", ""), str):
        raise RunFolderError(f"{path}: status={saved['status']!r} is not a word; {retrain}")
    if saved.get("status") == "finished":
        for key in _FINISHED_NUMBERS:
            if key in saved or key in require or key != "final_train_loss":
                _check_number(path, saved, key)
        if not 0.0 <= saved["accuracy"] <= 1.0:
            raise RunFolderError(f"{path}: accuracy={saved['accuracy']!r} is not in [0, 1]")
    return saved


def _check_number(path: Path, saved: dict[str, Any], key: str) -> None:
    retrain = retrain_advice(path.parent)
    if key not in saved:
        raise RunFolderError(f"{path} lacks {key!r}, which a finished run records; {retrain}")
    value = saved[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value):
        raise RunFolderError(f"{path}: {key}={value!r} is not a number; {retrain}")


def sweep_of_run(run_dir: str | os.PathLike[str]) -> Path | None:
    """The sweep folder that ``run_dir`` belongs to (``SWEEP/runs/NAME``, beside
    ``SWEEP/sweep.json``), or None for a run of its own. The folder need not exist.

    Example:
        >>> sweep_of_run("runs/reverse/runs/h4_seed0")  # doctest: +SKIP
        PosixPath('runs/reverse')
    """
    runs_folder = Path(run_dir).parent
    if runs_folder.name == "runs" and (runs_folder.parent / SWEEP_FILE).is_file():
        return runs_folder.parent
    return None


def retrain_advice(run_dir: str | os.PathLike[str]) -> str:
    """How to retrain a run whose files are refused, in a way that works: ``train --overwrite``
    replaces a run of its own, damaged or not; a sweep checks its runs' files before it
    resumes and would refuse them again, so a run of a sweep has to leave it first (the user
    moves or deletes it, never this toolkit).

    Example:
        >>> retrain_advice("elsewhere/rev_h4")
        'retrain it: rerun its train command with --overwrite (or move elsewhere/rev_h4 away first)'
    """
    sweep = sweep_of_run(run_dir)
    if sweep is None:
        return (
            f"retrain it: rerun its train command with --overwrite (or move {run_dir} away first)"
        )
    return f"retrain it: move {run_dir} out of {sweep} (or delete it), then rerun the sweep"


_DIVERGED_AT = re.compile(r"\bat step (\d+)")
"""Where the loss went bad, in the message that training saves in a diverged run's eval.json."""


def check_not_diverged(
    run_dir: str | os.PathLike[str], saved: dict[str, Any] | None = None
) -> None:
    """Refuse a run whose ``eval.json`` (``saved``, when already read) says it diverged: its
    folder keeps the last good weights (often the untrained ones) to show what went wrong,
    not a trained model to analyse.

    Raises:
        RunFolderError: it diverged (one line saying where, and what to do).
    """
    run_dir = Path(run_dir)
    if saved is None:
        if not (run_dir / "eval.json").is_file():
            return
        saved = read_eval(run_dir)
    if saved.get("status") != "diverged":
        return
    found = _DIVERGED_AT.search(str(saved.get("message", "")))
    where = f" at step {found.group(1)}" if found else ""
    raise RunFolderError(
        f"{run_dir} diverged{where} (its eval.json says so): it holds no trained model; "
        "retrain it with a lower --lr"
    )


_digests: dict[tuple[str, int, int], str] = {}


def weights_digest(run_dir: str | os.PathLike[str]) -> str | None:
    """SHA-256 (hex) of ``run_dir/model.safetensors``, or None when there is none (cached per
    file size and modification time within a process)."""
    path = Path(run_dir) / "model.safetensors"
    try:
        info = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), info.st_size, info.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def run_status(run_dir: str | os.PathLike[str]) -> Literal["empty", "unfinished", "finished"]:
    """``"empty"`` (no run file), ``"unfinished"`` (killed, or diverged: redoing it loses
    nothing) or ``"finished"`` (every run file there, eval.json says so).

    Raises:
        RunFolderError: eval.json exists but is damaged. A killed write cannot leave it so,
            hence this is refused, never redone over.
    """
    run_dir = Path(run_dir)
    present = [(run_dir / name).is_file() for name in RUN_FILES]
    if not any(present):
        return "empty"
    if not (run_dir / "eval.json").is_file():
        return "unfinished"
    finished = read_eval(run_dir).get("status") == "finished"
    return "finished" if finished and all(present) else "unfinished"


def is_finished_run(run_dir: str | os.PathLike[str]) -> bool:
    """True when every run file exists and ``eval.json`` says the run finished.

    Raises:
        RunFolderError: eval.json is damaged (see :func:`run_status`).
    """
    return run_status(run_dir) == "finished"


# ----- the other run files ---------------------------------------------------------------------
METRIC_COLUMNS = ("step", "loss", "lr", "grad_norm")


def check_metrics(
    metrics_path: Path, metrics: pd.DataFrame, train_config: Any, saved_eval: dict
) -> None:
    """The curve that :func:`train` wrote for a finished run ends, complete, at its last step
    with the ``final_train_loss`` of ``eval.json`` (runs saved by hand are not checked)."""
    if saved_eval.get("status") != "finished" or "final_train_loss" not in saved_eval:
        return
    retrain = retrain_advice(metrics_path.parent)
    missing = [c for c in METRIC_COLUMNS if c not in metrics.columns]
    if missing:
        raise RunFolderError(f"{metrics_path} lacks the columns {missing}; {retrain}")
    if metrics.empty:  # checked first: pandas reads a header-only column as text
        raise RunFolderError(
            f"{metrics_path} is cut short: it holds no rows, but the run trained "
            f"{train_config.steps} steps; {retrain}"
        )
    for column in METRIC_COLUMNS:
        _check_numeric_column(metrics_path, metrics[column], retrain)
    last = metrics[list(METRIC_COLUMNS)].tail(1)
    complete = (
        not last.isna().any(axis=None)
        and int(last["step"].iloc[0]) == train_config.steps
        and math.isclose(float(last["loss"].iloc[0]), float(saved_eval["final_train_loss"]))
    )
    if not complete:
        raise RunFolderError(
            f"{metrics_path} is cut short: it ends at step {last['step'].iloc[0]} (or its last "
            f"row is incomplete), but the run trained {train_config.steps} steps; {retrain}"
        )


def _check_numeric_column(metrics_path: Path, values: pd.Series, retrain: str) -> None:
    if pd.api.types.is_numeric_dtype(values):
        return
    bad = values[pd.to_numeric(values, errors="coerce").isna() & values.notna()]
    shown = f"{bad.iloc[0]!r}" if len(bad) else "text"
    raise RunFolderError(
        f"{metrics_path}: column {values.name!r} holds {shown}, not a number; {retrain}"
    )


WEIGHT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def check_dtype_name(name: Any) -> None:
    """A saved ``model.dtype`` names a torch floating dtype (ModelConfig would look it up)."""
    check_option("model.dtype", name, WEIGHT_DTYPES)


def check_tensors(
    weights_path: Path,
    config_path: Path,
    state: dict[str, Any],
    model: HookedMHATransformer,
) -> None:
    """``state`` (name -> tensor, read from ``weights_path``) fits ``model`` (built from
    ``config_path``): every tensor the model needs is there with the config's shape and dtype,
    and finite; nothing else is. (``load_state_dict`` would convert int64 or float16 silently.)
    A tensor on the meta device (a file's header read without its values) is checked for its
    shape and dtype only.
    """
    wanted = model.state_dict()
    missing, extra = sorted(set(wanted) - set(state)), sorted(set(state) - set(wanted))
    problems = [f"lacks {', '.join(missing[:3])}"] if missing else []
    problems += [f"has tensors the config has no place for ({', '.join(extra[:3])})"] * bool(extra)
    for name in sorted(set(wanted) & set(state)):
        have, need = state[name], wanted[name]
        if have.shape != need.shape:
            problems.append(
                f"{name} has shape {list(have.shape)} where config.json needs {list(need.shape)}"
            )
        elif have.dtype != need.dtype:
            problems.append(
                f"{name} is stored as {str(have.dtype).removeprefix('torch.')} where config.json "
                f"says {str(need.dtype).removeprefix('torch.')}"
            )
        elif have.is_floating_point() and not have.is_meta and not bool(have.isfinite().all()):
            problems.append(f"{name} holds NaN or infinite values")
        if len(problems) >= 3:
            break
    if problems:
        raise RunFolderError(
            f"{weights_path} does not fit {config_path}: {'; '.join(problems)}. Restore the "
            f"run's own files, or {retrain_advice(weights_path.parent)}"
        )


# ----- folder kinds and discovery ---------------------------------------------------------------
def folder_kind(path: str | os.PathLike[str]) -> FolderKind:
    """``"run"``, ``"sweep"`` or ``"study"`` (a folder of sweep folders).

    Raises:
        FileNotFoundError: ``path`` is none of these (one line saying what each holds).
        RunFolderError: ``path`` is a run that diverged (:func:`check_not_diverged`).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder")
    if (path / SWEEP_FILE).is_file():
        return "sweep"
    if is_finished_run(path):
        return "run"
    check_not_diverged(path)  # a run folder still, but one that holds no trained model
    if sweep_folders(path):
        return "study"
    raise FileNotFoundError(
        f"{path} is not a run folder (config.json, model.safetensors, eval.json), a sweep "
        "folder (sweep.json, results.csv) or a folder of sweep folders"
    )


NewFolderKind = Literal["run", "sweep", "pretrained analysis", "pretrained verdict"]

# Files that mark what a folder holds: only files no other command writes there (config.json
# and metrics.csv are common names); for a run, eval.json first (what makes it read as a run).
_HELD_BY = {
    "run": ("eval.json", "model.safetensors", CHECKPOINT_FILE),
    "sweep": (SWEEP_FILE,),
    "pretrained verdict": (PRETRAINED_VERDICT_FILE,),
    "pretrained analysis": (PRETRAINED_ANALYSIS_FILE,),
}


def check_free_folder(path: str | os.PathLike[str], kind: NewFolderKind, name: str) -> None:
    """Refuse ``path`` as the folder of a new ``kind`` where it is an empty path (the current
    folder, by accident) or already holds another kind (a run, a sweep, a pretrained model's
    verdict or analysis) or sweep folders: readers take such a folder for one of them and skip
    the rest, and the two pretrained commands overwrite each other's ``provenance.json``
    (``name``: how the message names the folder, ``--out`` for the CLI, ``run_dir`` or
    ``out_dir`` for the library).

    Example:
        >>> check_free_folder("runs/new_sweep", "sweep", "--out")  # free: nothing raised
    """
    if os.fspath(path) == "":
        raise invalid(name, "", "a folder path, not empty (give . for the current folder)")
    path = Path(path)
    if not path.is_dir():
        return
    held = None
    for other, files in _HELD_BY.items():
        found = next((path / f for f in files if (path / f).is_file()), None)
        if other != kind and found is not None:
            held = f"a {other} ({found})"
            break
    if held is None and (sweeps := sweep_folders(path)):
        held = f"sweep folders ({sweeps[0] / SWEEP_FILE})"
    if held is not None:
        raise invalid(
            name,
            str(path),
            f"a folder free for this {kind}, but it holds {held}; choose another {name}",
        )


def sweep_folders(path: str | os.PathLike[str]) -> list[Path]:
    """The sweep folders (with ``sweep.json``) directly inside ``path``, sorted by name."""
    path = Path(path)
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / SWEEP_FILE).is_file())


def find_runs(path: str | os.PathLike[str]) -> list[Path]:
    """Finished run folders at ``path``: the folder itself, or every run below it (sorted),
    symbolic links followed.

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no finished run.
        RunFolderError: a run below it has a damaged eval.json, or diverged (a run left out
            without a word would change what a folder's results say).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        raise FileNotFoundError(f"{path} is a file, not a folder: give its folder ({path.parent})")
    if is_finished_run(path):
        return [path]
    folders = _folders(path)
    for folder in folders:
        check_not_diverged(folder)
    runs = sorted(folder for folder in folders if is_finished_run(folder))
    if not runs:
        raise FileNotFoundError(f"no finished run folder (with eval.json) under {path}")
    return runs


def _folders(root: Path) -> list[Path]:
    """Every folder below ``root`` holding an eval.json, links followed (a cycle is cut); a
    folder reached both directly and through a link is listed once, by its direct path."""
    found: dict[str, Path] = {}
    for folder in _walk(root, frozenset()):
        real = os.path.realpath(folder)
        direct = real == os.path.abspath(folder)
        if real not in found or direct:
            found[real] = folder
    return list(found.values())


def _walk(folder: Path, ancestors: frozenset[str]) -> Iterator[Path]:
    real = os.path.realpath(folder)
    if real in ancestors:  # a link back up the tree
        return
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    if any(entry.name == "eval.json" for entry in entries):
        yield folder
    for entry in entries:
        if entry.name == ANALYSIS_DIR or entry.name.startswith("."):
            continue
        if entry.is_dir():  # follows links
            yield from _walk(folder / entry.name, ancestors | {real})


# ----- results.csv ------------------------------------------------------------------------------
def resolve_run_dir(recorded: str | os.PathLike[str], table_dir: str | os.PathLike[str]) -> Path:
    """The run folder a ``run_dir`` entry of ``table_dir/results.csv`` means.

    Relative entries are relative to ``table_dir``. Tables written before that (an absolute
    path, or a path relative to where the sweep was started) are read by the run's name under
    ``table_dir/runs/``; an absolute path elsewhere is used when that does not exist. The
    current directory is never looked at.

    Example:
        >>> resolve_run_dir("runs/h4_seed0", "elsewhere/rev")
        PosixPath('elsewhere/rev/runs/h4_seed0')
    """
    recorded, table_dir = Path(recorded), Path(table_dir)
    here = recorded if recorded.is_absolute() else table_dir / recorded
    by_name = table_dir / "runs" / recorded.name
    for candidate in (here, by_name) if not recorded.is_absolute() else (by_name, here):
        if candidate.is_dir():
            return candidate
    return here


def relative_run_dir(run_dir: str | os.PathLike[str], table_dir: str | os.PathLike[str]) -> str:
    """How a table in ``table_dir`` records ``run_dir``: relative, with ``/``.

    Example:
        >>> relative_run_dir("out/rev/runs/h4_seed0", "out/rev")
        'runs/h4_seed0'
    """
    return Path(os.path.relpath(run_dir, table_dir)).as_posix()


def read_results(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """``sweep_dir/results.csv`` with ``run_dir`` resolved (see :func:`resolve_run_dir`).

    A row repeated word for word is dropped with a warning (it is not another seed); two
    different rows for one run are refused.

    Raises:
        FileNotFoundError: there is no results.csv, or a run it lists is missing.
        RunFolderError: it is empty, cut short, not a CSV table, lacks ``run_dir`` (or a row
            its value), two of its rows disagree about one run, or a row's accuracy or loss is
            not what its run's ``eval.json`` says now (the run was retrained after the sweep).

    Example:
        >>> summarize(read_results("runs/rev"))  # doctest: +SKIP
    """
    path = Path(sweep_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run mhainterp sweep first)")
    table = _read_results_table(path)
    _check_run_dir_column(path, table)
    table = migrate_results(table, sweep_dir)
    repeated = table.duplicated()
    if repeated.any():
        warnings.warn(
            f"{path} repeats {int(repeated.sum())} row(s) word for word; each run is counted "
            "once (rerun the same mhainterp sweep to rewrite the table)",
            stacklevel=2,
        )
        table = table[~repeated].reset_index(drop=True)
    clash = table["run_dir"].duplicated(keep=False)
    if clash.any():
        runs = sorted(set(table.loc[clash, "run_dir"]))
        raise RunFolderError(
            f"{path} has different rows for one run ({', '.join(runs)}); rerun the same "
            "mhainterp sweep to rewrite it"
        )
    _check_listed_runs_exist(path, table)
    _check_rows_match_runs(path, table)
    return table


def _check_run_dir_column(path: Path, table: pd.DataFrame) -> None:
    """Every row names its run (a row without one cannot be resolved)."""
    if "run_dir" not in table.columns:
        raise RunFolderError(
            f"{path} lacks the run_dir column; rerun the same mhainterp sweep to rewrite it"
        )
    blank = table.index[table["run_dir"].isna()]
    if len(blank):
        raise RunFolderError(
            f"{path}: row {int(blank[0]) + 1} has no run_dir; rerun the same mhainterp sweep "
            "to rewrite it"
        )


def _check_listed_runs_exist(path: Path, table: pd.DataFrame) -> None:
    """A run the table lists is there: said here, naming the run and the table, rather than
    by the first reader that opens its folder (as a folder missing its files)."""
    for recorded in table["run_dir"]:
        run_dir = Path(recorded)
        if not run_dir.exists():
            raise FileNotFoundError(
                f"run {run_dir.name}, listed in {path}, is missing ({run_dir}); rerun the "
                "sweep to retrain it"
            )


_ROW_NUMBERS = {"val_accuracy": "accuracy", "val_loss": "loss"}  # results.csv <- eval.json


def _check_rows_match_runs(path: Path, table: pd.DataFrame) -> None:
    """Refuse a row whose numbers are not those its run's eval.json holds now: the run was
    retrained (``train --overwrite`` with other settings) after the sweep wrote the table,
    and a summary of the old numbers beside analyses of the new weights would mix two
    models without a word."""
    columns = [c for c in _ROW_NUMBERS if c in table.columns]
    for row in table.itertuples(index=False):
        run_dir = Path(row.run_dir)
        if not columns or not (run_dir / "eval.json").is_file():
            continue
        saved = read_eval(run_dir)
        if saved.get("status") != "finished":
            continue
        for column in columns:
            recorded, now = getattr(row, column), saved[_ROW_NUMBERS[column]]
            if not math.isclose(float(recorded), float(now), rel_tol=1e-9, abs_tol=1e-12):
                raise RunFolderError(
                    f"{path} says {column}={float(recorded):.4g} for {run_dir.name}, but "
                    f"{run_dir / 'eval.json'} says {_ROW_NUMBERS[column]}={float(now):.4g}: "
                    "the run was retrained after the sweep; retrain it with the sweep's "
                    "settings (or move it out), then rerun the same mhainterp sweep"
                )


def _read_results_table(path: Path) -> pd.DataFrame:
    if path.stat().st_size == 0:
        raise RunFolderError(f"{path} is empty (0 bytes); rerun the same mhainterp sweep")
    if not _ends_with_line_end(path):  # the sweep writes whole rows: a cut row has no end
        raise RunFolderError(
            f"{path} is cut short: its last row is incomplete (no line end); rerun the same "
            "mhainterp sweep to rewrite it"
        )
    try:
        return pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as error:  # EmptyDataError, ParserError
        reason = " ".join(str(error).split())
        raise RunFolderError(f"{path} is not a readable CSV table ({reason})") from None


def _ends_with_line_end(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) in (b"\n", b"\r")


# ----- old folders ------------------------------------------------------------------------------
def migrate_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run's ``config.json`` in the current format (a copy; the input is not changed).

    What older versions wrote, and what it becomes:

    - ``train.eval_size`` (the name of ``n_eval`` before the rename) -> ``train.n_eval``.

    Example:
        >>> migrate_config({"train": {"eval_size": 64}})["train"]
        {'n_eval': 64}
    """
    out = dict(config)
    if isinstance(out.get("train"), dict) and "eval_size" in out["train"]:
        train = dict(out["train"])
        train.setdefault("n_eval", train.pop("eval_size"))
        train.pop("eval_size", None)
        out["train"] = train
    return out


_RENAMED_SETTINGS = {"n_sequences": "n_eval", "ablation_method": "method"}
"""Old name -> current name of a saved specialization setting."""


def migrate_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Saved specialization settings in the current format: ``n_sequences`` -> ``n_eval``,
    ``ablation_method`` -> ``method``.

    Example:
        >>> migrate_settings({"n_sequences": 256, "ablation_method": "zero"})
        {'n_eval': 256, 'method': 'zero'}
    """
    out = dict(settings)
    for old, new in _RENAMED_SETTINGS.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    return out


_OLD_SEPARATOR = ";"
_HEAD_SET = re.compile(r"^L\d+H\d+(;L\d+H\d+)+$")


HEAD_KEYS = ["head_label", "layer", "head"]
"""The columns a per-head table leads with (DESIGN: Results and files)."""


def lead_with_head(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with :data:`HEAD_KEYS` moved to the front when it has all three (a per-head
    table); the other columns keep their order.

    Example:
        >>> lead_with_head(pd.DataFrame(columns=["run", "layer", "head", "head_label", "x"]))
        Empty DataFrame
        Columns: [head_label, layer, head, run, x]
        Index: []
    """
    if not set(HEAD_KEYS) <= set(frame.columns):
        return frame
    return frame[[*HEAD_KEYS, *(c for c in frame.columns if c not in HEAD_KEYS)]]


def migrate_results(
    table: pd.DataFrame, table_dir: str | os.PathLike[str] | None = None
) -> pd.DataFrame:
    """A saved table in the current format (a copy; the input is not changed).

    What older versions wrote, and what it becomes:

    - head sets separated by ``;`` (``L0H1;L0H3``) -> ``L0H1,L0H3``, in every text column;
    - per-head tables with ``head_label, layer, head`` after the run's columns -> those three
      first (:func:`lead_with_head`);
    - with ``table_dir`` (a sweep's ``results.csv``): every ``run_dir`` resolved from it,
      absolute paths and paths relative to where an old sweep was started included
      (:func:`resolve_run_dir`).

    Example:
        >>> migrate_results(pd.DataFrame({"heads": ["L0H1;L0H3", "L0H2"]}))["heads"].tolist()
        ['L0H1,L0H3', 'L0H2']
    """
    table = lead_with_head(_migrate_head_sets(table))
    if table_dir is not None and "run_dir" in table.columns:
        table["run_dir"] = [str(resolve_run_dir(r, table_dir)) for r in table["run_dir"]]
    return table


def _migrate_head_sets(table: pd.DataFrame) -> pd.DataFrame:
    """A copy with head sets written ``L0H1;L0H3`` (the old separator) as ``L0H1,L0H3``."""
    table = table.copy()
    for column in table.columns:
        values = table[column]
        textual = values.dtype == object or pd.api.types.is_string_dtype(values)
        # an old head set has the old separator: a column without one is current (most are;
        # the regex over every text column was most of reading a saved table)
        if textual and _has_old_separator(values) and values.astype(str).str.match(_HEAD_SET).any():
            table[column] = [
                v.replace(_OLD_SEPARATOR, ",") if isinstance(v, str) and _HEAD_SET.match(v) else v
                for v in values
            ]
    return table


def _has_old_separator(values: pd.Series) -> bool:
    """Whether any value, written as text, contains :data:`_OLD_SEPARATOR`."""
    return any(_OLD_SEPARATOR in (v if isinstance(v, str) else str(v)) for v in values.tolist())


def migrate_folder(path: str | os.PathLike[str]) -> list[Path]:
    """Rewrite an old run, sweep or study folder in the current format, in place (atomically,
    file by file); return the files changed.

    Changes: ``train.eval_size`` in ``config.json`` and ``sweep.json`` (:func:`migrate_config`);
    ``n_sequences`` and ``ablation_method`` in saved specialization settings
    (:func:`migrate_settings`); head sets
    separated by ``;`` in ``analysis/*.csv`` (:func:`migrate_results`); absolute or
    start-relative ``run_dir`` entries in ``results.csv`` (written relative to the sweep
    folder). Reading needs none of this: the
    readers (``load_run``, :func:`read_results`, :func:`read_table`, the saved specialization
    result) apply the same functions, and read only the current format after them.

    Example:
        >>> migrate_folder("runs/old_sweep")  # doctest: +SKIP
        [PosixPath('runs/old_sweep/results.csv')]
    """
    path = Path(path)
    changed: list[Path] = []
    for results in sorted(path.rglob(RESULTS_FILE)):
        table = _read_results_table(results)
        if "run_dir" in table.columns:
            fixed = table.assign(
                run_dir=[
                    relative_run_dir(resolve_run_dir(r, results.parent), results.parent)
                    for r in table["run_dir"]
                ]
            )
            if not fixed.equals(table):
                changed.append(write_csv(results, fixed))
    for config_path in sorted([*path.rglob("config.json"), *path.rglob(SWEEP_FILE)]):
        config = read_json(config_path)
        if isinstance(config, dict) and migrate_config(config) != config:
            changed.append(write_json(config_path, migrate_config(config)))
    for meta_path in sorted(path.rglob(f"{ANALYSIS_DIR}/specialization*.json")):
        meta = read_json(meta_path)
        if isinstance(meta, dict) and isinstance(meta.get("settings"), dict):
            settings = migrate_settings(meta["settings"])
            if settings != meta["settings"]:
                changed.append(write_json(meta_path, {**meta, "settings": settings}))
    for csv_path in sorted(path.rglob(f"{ANALYSIS_DIR}/*.csv")):
        if csv_path.stat().st_size == 0:
            continue
        table = pd.read_csv(csv_path)
        fixed = migrate_results(table)
        if not fixed.equals(table):
            changed.append(write_csv(csv_path, fixed))
    return changed


def read_saved_meta(path: str | os.PathLike[str], keys: tuple[str, ...]) -> dict[str, Any]:
    """A saved result's JSON metadata, checked: an object with ``keys``.

    Raises:
        FileNotFoundError: it does not exist.
        RunFolderError: it is damaged (the message names it and says how to rewrite it).
    """
    path = Path(path)
    try:
        meta = read_json(path)
    except ValueError as error:
        raise RunFolderError(f"{error}; {_RECOMPUTE}") from None
    if not isinstance(meta, dict):
        raise RunFolderError(
            f"{path} is not a JSON object (it holds a {type(meta).__name__}); {_RECOMPUTE}"
        )
    missing = [key for key in keys if key not in meta]
    if missing:
        raise RunFolderError(f"{path} lacks {', '.join(map(repr, missing))}; {_RECOMPUTE}")
    return meta


_RECOMPUTE = "delete it and run mhainterp specialize (or analyze) again to rewrite it"


def read_table(
    path: str | os.PathLike[str], *, dtype: dict[str, Any] | None = None
) -> pd.DataFrame:
    """A saved CSV table, in the current format (:func:`migrate_results`), with ``dtype`` as
    in :func:`pandas.read_csv`. A table saved empty reads as an empty DataFrame.

    Raises:
        RunFolderError: the file has 0 bytes (no writer here leaves that: damaged) or does
            not parse; the message names it.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise RunFolderError(f"{path} is empty (0 bytes); {_RECOMPUTE}")
    try:
        table = pd.read_csv(path, dtype=dtype)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (ValueError, UnicodeDecodeError) as error:  # ParserError
        reason = " ".join(str(error).split())
        raise RunFolderError(f"{path} is not a readable CSV table ({reason})") from None
    return migrate_results(table)


def read_result_table(
    path: str | os.PathLike[str],
    columns: Iterable[str],
    *,
    text: Iterable[str] = (),
    dtype: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """A saved analysis table in the current format: :func:`read_table`, with every one of
    ``columns``; the ``text`` columns present read ``""`` where CSV wrote an empty string
    (pandas reads it back as NaN), ``dtype`` as in :func:`pandas.read_csv`.

    Raises:
        FileNotFoundError: it does not exist.
        OutdatedResultError: it lacks some of ``columns`` (an older mhainterp wrote it); the
            message names the file, the columns, and the command that rewrites it.
        RunFolderError: it is damaged (empty or not CSV).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = write_csv(path, pd.DataFrame({"by": ["token"], "call": [""]}))
        >>> read_result_table(path, ["by", "call"], text=["call"])["call"].tolist()
        ['']
        >>> read_result_table(path, ["by", "basis"])
        Traceback (most recent call last):
        ...
        mhainterp.errors.OutdatedResultError: ... lacks the column basis: ...
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; run mhainterp specialize (or analyze) again to write it"
        )
    table = read_table(path, dtype=dtype)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        which = "column" if len(missing) == 1 else "columns"
        raise OutdatedResultError(
            f"{path} lacks the {which} {', '.join(missing)}: an older mhainterp saved it; "
            f"{_RECOMPUTE}"
        )
    present = [c for c in text if c in table.columns]
    if present:
        table[present] = table[present].fillna("").astype(str)
    return table
