"""Ablate heads interactively: a browser explorer (``mhainterp explore``) and a notebook view.

The page shows the head grid (each head's average pattern, its saved specialization label and
its single-head importance; click a head to ablate or restore it), a method switch (zero, mean,
resample) and reset, live loss and accuracy against the clean model (overall, per target, by
target class or query token), and one example sequence with right/wrong predictions; hovering a
token shows where each head attends from it (click to lock). For a sweep, a picker over runs.

On a pretrained model and real text (``explore(load_pretrained("smollm2"), "stdlib")``,
``mhainterp explore --model smollm2 --text stdlib``) the same page shows the next-token
cross-entropy (an encoder's embedding damage), the example sentence's tokens coloured by the
change in log-probability of each as the next token, and per head the attribution estimate
of its loss change, computed once at load; a click shows the set's estimate at once, then
ablates it exactly (a newer click cancels that work: :mod:`mhainterp.explore.exact`). With a
saved verdict each head's finding shows beside its card (:mod:`mhainterp.explore.results`).

Modules, each with one job::

    session.py   ExploreSession: the only caller of the ablation and scoring code
    app.py       Explorer: runs, sessions and the one request handler
    exact.py     click jobs: a newer click cancels an older click's exact work
    results.py   saved per-head results (labels, importance, division of labour)
    text.py      what differs on real text: the text axes, tokens as strings
    runs.py      which runs a folder holds
    server.py    Starlette app and socket binding (the CLI, tests)
    wire.py      strict JSON for the page (NaN and infinity as null, "not measured")
    memory.py    hands freed memory back to the system between clicks
    widget.py    the anywidget notebook view
    assets/      index.html, explorer.js (one ES module for both views), explorer.css

Example:
    >>> import mhainterp
    >>> mhainterp.explore("runs/quickstart/reverse/runs/h4_seed0")  # doctest: +SKIP

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``analyze``, ``attribution``, ``capture``, ``config``, ``data``,
``errors``, ``heads``, ``io``, ``protocol``, ``provenance``, ``runs``, ``runtime``, ``scoring``,
``specialization``, ``tasks``, ``training``, ``validation``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from typing import TYPE_CHECKING, Any

from mhainterp.errors import BadRequestError  # light: its home is errors.py

if TYPE_CHECKING:
    from mhainterp.explore.app import Explorer
    from mhainterp.explore.session import ExploreSession

__all__ = ["TEXT_N_EVAL", "BadRequestError", "ExploreSession", "Explorer", "explore"]

TEXT_N_EVAL = 16
"""Sentences of a text a pretrained model is explored on by default: a click re-runs the model
from the first ablated layer on all of them (SmolLM2 on 16 sentences, 2 busy cores: one head
0.64-1.05 s, growing sets 0.86-1.10 s, medians of 5 rounds; analysis/bench_explore.py)."""

_LAZY = {
    "Explorer": "mhainterp.explore.app",
    "ExploreSession": "mhainterp.explore.session",
}
"""Imported on first use: ``import mhainterp`` binds :func:`explore` (this package's name at
the top level) without loading the server and the ablation code behind it."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mhainterp.explore' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def explore(
    run: Any,
    task: Any = None,
    *,
    n_eval: int | None = None,
    method: str = "zero",
    verdict: str | os.PathLike[str] | None = None,
) -> Any:
    """The explorer as a notebook widget: display it (last line of a cell) to use it inline.

    Args:
        run: A run folder or sweep folder (path), a loaded ``Run``, or a model (then give
            ``task``): our own, or a pretrained one from ``load_pretrained``.
        task: With a model: the Task (its fixed evaluation set) or a Batch to evaluate on;
            with a pretrained model also ``"stdlib"`` or a text file (its first ``n_eval``
            sentences, :func:`~mhainterp.tasks.text.text_batch`).
        n_eval: Evaluation sequences (default 1,024; sentences of a text: 16).
        method: Initial ablation method: ``"zero"``, ``"mean"`` or ``"resample"``.
        verdict: With a pretrained model and a text: the folder ``mhainterp specialize
            --model NAME --out FOLDER`` wrote, for each head's finding beside its card.

    Returns:
        An ``ExplorerWidget`` (needs ``pip install "mhainterp[explore]"``).

    Example:
        >>> from mhainterp import explore, handbuilt_model, get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> view = explore(handbuilt_model(["previous", "uniform"]), task)  # doctest: +SKIP
        >>> view = explore(load_pretrained("smollm2"), "stdlib", n_eval=16)  # doctest: +SKIP
    """
    from mhainterp.config import DEFAULT_N_EVAL
    from mhainterp.explore.app import Explorer, no_verdict_note
    from mhainterp.explore.results import SavedResults
    from mhainterp.protocol import BridgedModel
    from mhainterp.training import Run

    try:
        from mhainterp.explore.widget import ExplorerWidget
    except ImportError as error:  # the explore extra is optional
        raise ImportError(
            f'the notebook explorer needs anywidget ({error}): pip install "mhainterp[explore]"'
        ) from error

    options = {"n_eval": n_eval or DEFAULT_N_EVAL, "method": method}
    if isinstance(run, BridgedModel) and isinstance(task, (str, os.PathLike)):
        return ExplorerWidget(
            Explorer.from_text(
                run, task, n_eval=n_eval or TEXT_N_EVAL, method=method, verdict=verdict
            )
        )
    if isinstance(run, (str, os.PathLike)):
        explorer = Explorer.from_path(run, **options)
    elif isinstance(run, Run):
        saved = SavedResults.load(run.path)  # labels and importance saved beside the run
        name = run.path.name
        note = None if saved.has_verdict else no_verdict_note(str(run.path))
        explorer = Explorer.from_model(
            run.model, run.task, name=name, saved=saved, verdict_note=note, **options
        )
    elif task is not None:
        explorer = Explorer.from_model(run, task, **options)
    else:
        raise TypeError(
            f"run must be a run or sweep folder, a Run, or a model with task=, got "
            f"{type(run).__name__}"
        )
    return ExplorerWidget(explorer)


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`explore`.

    ``mhainterp.explore`` is both the subpackage and the function users call
    (``mhainterp.explore(run)``). When the name was bound to the function,
    ``import mhainterp.explore.server as server`` failed ("cannot import name 'server' from
    'explore'"): that import form looks each part up as an attribute. The package itself,
    callable, serves both.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return explore(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__signature__ = inspect.signature(explore)  # what help() and IDEs show for the call
