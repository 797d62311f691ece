"""``specialization_test``: label every head and state the verdict, with the evidence.

For each run (a trained model and its task), on ``n_eval`` sequences of the task's fixed
evaluation set (held out from training):

1. role scores and their two nulls (:mod:`.roles`, :mod:`.nulls`), p-values corrected over every
   head x role test of the run;
2. each head's residual write, for the *dead* test (``output_ratio < dead_tol``);
3. single-head ablations: the head x target damage matrix and, on multi-target tasks, causal
   selectivity with its permutation null (:mod:`.causal`);
4. redundancy from similarity + pairwise and group backup (:mod:`.redundancy`);
5. with several runs of one task and head count: cross-seed consistency (:mod:`.consistency`);
6. the labels re-decided with every threshold x 0.8 and x 1.25 from the saved evidence
   (:mod:`.stability`; table ``stability``).

Each head then gets one **label** (:mod:`.labels`): ``"dead"`` > ``"backed up"`` > its distinct
role (e.g. ``"previous"``, or ``"count:same_token_upto+sink"`` for a counting head) >
``"unspecialized"`` (which includes heads that mix two relations), the flags ``holds``,
``needed``, ``backed_up``, ``dead``, and the share of its attention the known roles
``explained``; the run gets a :class:`~mhainterp.specialization.RunVerdict` whose text is generated
from the tables. Whom the heads serve (the division test) enters with ``division=True`` (it runs
:func:`~mhainterp.specialization.division_of_labour`), ``division=`` a result of it, or
:func:`attach_division` afterwards; without it the verdict does not claim that the heads
divide the work.

Example:
    >>> result = specialization_test("runs/quickstart/reverse/runs/h4_seed0")  # doctest: +SKIP
    >>> print(result.verdict.text)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import BridgedModel
from mhainterp.runtime import uses_work_threads
from mhainterp.specialization.run_analysis import RunInput, analyse_run
from mhainterp.specialization.seeds.combine import attach_division, combine_results, single_result
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.specialization.verdict.result import (
    SpecializationResult,
)
from mhainterp.specialization.whom.division import division_of_labour
from mhainterp.specialization.whom.division_result import DivisionResult
from mhainterp.specialization.whom.screen import EXACT
from mhainterp.tasks import Task
from mhainterp.training import Run, load_run
from mhainterp.validation import ParameterError, invalid

# The result, its columns and the combining live in .result and .combine; they are re-exported
# here, where they have always been importable from.
__all__ = [
    "specialization_test",
]

_RunSource = str | os.PathLike[str] | Run | HookedMHATransformer | tuple[HookedMHATransformer, Task]
"""One input of :func:`specialization_test`: a run folder, a Run, a model (with ``data``) or a
``(model, task)`` pair."""


# ----------------------------------------------------------------------------- inputs


def _resolve(
    run_or_model: _RunSource | list[_RunSource] | tuple[_RunSource, ...], task: Task | None
) -> list[RunInput]:
    items = (
        list(run_or_model)
        if isinstance(run_or_model, (list, tuple)) and not _is_model_task_pair(run_or_model)
        else [run_or_model]
    )
    if not items:
        raise invalid(
            "run_or_model", run_or_model, "a run folder, a Run, a model or a non-empty list"
        )
    inputs = [_resolve_one(item, task, i) for i, item in enumerate(items)]
    names = _unique_names([i.run for i in inputs])
    for inp, name in zip(inputs, names, strict=True):
        inp.run = name
    return inputs


def _is_model_task_pair(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], (HookedMHATransformer, BridgedModel))
        and isinstance(value[1], Task)
    )


def _resolve_one(item: _RunSource, task: Task | None, index: int) -> RunInput:
    if isinstance(item, (str, os.PathLike)):
        item = load_run(item)
    if isinstance(item, Run):
        return RunInput(item.model, task or item.task, str(item.path), item.model_config.seed)
    if _is_model_task_pair(item):
        item, task = item
    if isinstance(item, (HookedMHATransformer, BridgedModel)):
        if task is None:
            what = "a Task when a model (not a run folder or Run) is given"
            if isinstance(item, BridgedModel):
                what = "a Task: for a pretrained model, TextTask(model, 'stdlib' or a text file)"
            raise invalid("data", task, what)
        name = _pretrained_name(item) if isinstance(item, BridgedModel) else f"model{index}"
        seed = int(getattr(item.cfg, "seed", 0) or 0)
        return RunInput(item, task, name, seed, pretrained=isinstance(item, BridgedModel))
    raise TypeError(
        "run_or_model must be a run folder, a training.Run, a HookedMHATransformer (with data), "
        "a pretrained model from load_pretrained (with a TextTask), a (model, task) pair, or a "
        f"list of these; got {type(item).__name__}"
    )


def _screened_exact(division: DivisionResult) -> frozenset[str] | None:
    """The heads a division's attribution screen computed exactly, or None without a screen
    (its heads table has no ``evidence`` column): the single-head damage of the
    specialization test then removes only these, the division's basis."""
    heads = division.heads
    if "evidence" not in heads.columns:
        return None
    return frozenset(heads.loc[heads["evidence"] == EXACT, "head_label"].astype(str))


def _same_pass(division: DivisionResult, settings: SpecializationSettings) -> bool:
    """Whether the division's in-memory single-head damage is what the specialization test's
    damage step would compute: the same method on the same ``n_eval`` sequences."""
    return (
        division.single_damage is not None
        and division.settings.get("method") == settings.method
        and division.settings.get("n_eval") == settings.n_eval
    )


def _pretrained_name(model: BridgedModel) -> str:
    """A pretrained model's name in the tables: its upstream name, else its source."""
    provenance = model.provenance
    return str(provenance.get("upstream") or provenance.get("source") or "pretrained")


def _unique_names(paths: list[str]) -> list[str]:
    """Shortest path suffixes that tell the runs apart (``h4_seed0``, ``reverse/runs/h4_seed0``)."""
    parts = [Path(p).parts or (p,) for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{name}#{i}" for i, name in enumerate(paths)]


# ----------------------------------------------------------------------------- public API


@uses_work_threads
def specialization_test(
    run_or_model: _RunSource | list[_RunSource] | tuple[_RunSource, ...],
    data: Task | None = None,
    settings: SpecializationSettings | None = None,
    *,
    progress: bool = False,
    division: bool | DivisionResult | pd.DataFrame | None = None,
    **overrides: Any,
) -> SpecializationResult:
    """Do the heads specialize? Label every head and state the verdict, with the evidence.

    Args:
        run_or_model: A run folder, a :class:`~mhainterp.training.Run`, a model (with
            ``data``), a ``(model, task)`` pair, or a list of these (e.g. the seeds of one
            head count, which adds cross-seed consistency).
        data: The :class:`~mhainterp.tasks.Task` whose relations and held-out evaluation set
            the test reads; needed with models, optional with runs (it overrides their own).
        settings: A :class:`SpecializationSettings`; ``**overrides`` replace its fields.
        progress: Show progress bars.
        division: Whom the heads serve: True runs
            :func:`~mhainterp.specialization.division_of_labour` on each run (with
            ``settings.division``: the same ``n_eval``, ``alpha``, method ...) and attaches it; a
            :class:`DivisionResult` (one run) or its index table (``run, by, index,
            null_index, p``) is attached as given (:func:`attach_division`). Without it
            each head's finding says "whom it serves not measured". A division computed
            under the attribution screen (a pretrained model's) also sets which heads the
            single-head damage removes: those it computed exactly.
        **overrides: Settings fields, e.g. ``alpha=0.01, n_eval=512``.

    Returns:
        A :class:`SpecializationResult` (``.heads``, ``.verdict.text`` ...).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> result = specialization_test(handbuilt_model(["previous", "dead"], d_head=18), task)
        >>> result.heads["label"].tolist()
        ['previous', 'dead']
        >>> specialization_test(handbuilt_model(["previous", "dead"], d_head=18), task,
        ...                     division=True).heads["finding"].tolist()
        ['looks at previous; serves no subset shown; needed', 'dead']
    """
    if data is not None and not isinstance(data, Task):
        raise ParameterError(
            f"specialization_test needs the Task itself, got a {type(data).__name__}: the role "
            "templates come from task.relations() and the held-out set from task.eval_batch(); "
            "pass the Task (its evaluation size is settings.n_eval)"
        )
    settings = settings or SpecializationSettings()
    if overrides:
        settings = SpecializationSettings.from_dict({**settings.to_dict(), **overrides})
    inputs = _resolve(run_or_model, data)
    if len(inputs) == 1 and isinstance(division, DivisionResult):
        inputs[0].exact = _screened_exact(division)
        if inputs[0].exact is not None and _same_pass(division, settings):
            inputs[0].single_damage = division.single_damage
    singles = []
    for inp in tqdm(inputs, desc="specialization", disable=not progress or len(inputs) == 1):
        single = single_result(analyse_run(inp, settings, progress), settings)
        if division is True:  # each run with its own division, before the runs are stacked
            single = attach_division(
                single, division_of_labour(inp.model, inp.task, settings=settings)
            )
        singles.append(single)
    result = combine_results(singles) if len(singles) > 1 else singles[0]
    if division is None or isinstance(division, bool):
        return result
    return attach_division(result, division)
