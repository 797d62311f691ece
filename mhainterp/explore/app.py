"""The explorer's state and its one request handler, shared by the HTTP server and the widget.

:class:`Explorer` holds the runs that can be picked, one :class:`ExploreSession` per opened run,
and the shown example. :meth:`Explorer.handle` answers an action with a JSON-ready dict, or
raises :class:`~mhainterp.errors.BadRequestError` (a ``ValueError``) with a message for the
user; both the server (``server.py``, HTTP 400) and the notebook widget (``widget.py``) call it,
so they behave alike.

Actions: ``state`` (everything the page draws), ``toggle {head}``, ``method {method}``,
``reset``, ``example {index} | {draw: true}``, ``run {run}`` (switch run; answers ``state``),
``attention {query}`` (where every head attends from one position of the shown example:
a large model's example carries no patterns), ``verify`` (check a few more attribution
estimates against exact ablation; answers the view, or ``{"cancelled": true}`` when a click
came meanwhile: it stops as a stale click's work does), ``exact {job}`` (the exact view of a
click answered with its estimate).

A click that answers at once: ``toggle {head, estimate: true}`` on a session whose importance
is an attribution estimate (a pretrained next-token model) answers without a forward:
``{"method", "ablated", "estimate", "job"}`` (:meth:`ExploreSession.estimate`); the page then
asks ``exact {job}`` for the view. Every change of the ablated heads or the method starts a new
job (:class:`~mhainterp.explore.exact.ClickJobs`), so an older click's exact work is skipped
before its forward, or stops at its next layer if it is running, and answers
``{"job", "cancelled": true}``. Without ``estimate`` (and for exact importance) a toggle
answers the exact view, as before. ``handle`` is thread-safe: requests are served one at a
time, except that a new click cancels the running exact work before it waits its turn.

Example:
    >>> explorer = Explorer.from_model(model, task)  # doctest: +SKIP
    >>> explorer.handle("toggle", {"head": "L0H1"})["metrics"]["overall"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mhainterp.ablation import METHODS, Method
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.errors import BadRequestError
from mhainterp.explore import TEXT_N_EVAL
from mhainterp.explore.exact import ClickCancelled, ClickJobs
from mhainterp.explore.memory import release_free_memory
from mhainterp.explore.results import SavedResults
from mhainterp.explore.runs import RunEntry, default_run, explorable_runs
from mhainterp.explore.session import ExploreSession, ImportanceSource
from mhainterp.explore.text import axis_title
from mhainterp.explore.wire import json_ready
from mhainterp.heads import head_label, resolve_heads
from mhainterp.protocol import BridgedModel, HookedModel
from mhainterp.runtime import work_threads
from mhainterp.validation import check_int, invalid

__all__ = ["ACTIONS", "Explorer", "answer_message"]

ACTIONS = (
    "state",
    "toggle",
    "method",
    "reset",
    "example",
    "run",
    "attention",
    "verify",
    "exact",
)

CHANGES = ("toggle", "method", "reset", "run")
"""Actions that change what is ablated (or the run): each starts a new click job, so older
clicks' exact work is cancelled (:class:`~mhainterp.explore.exact.ClickJobs`)."""

LOSS_NAMES = {
    "classes": "loss",
    "next_token": "next-token cross-entropy",
    "embedding": "embedding damage (1 − cos)",
}
"""What the page calls the session's loss, by model objective."""

OPEN_RUNS = 3
"""Runs of a sweep whose sessions (model, batch, cached results) are kept; opening another
drops the least recently shown one, remembering its ablated heads. Each session
holds up to :data:`~mhainterp.ablation.interactive.DEFAULT_CACHE_BYTES` of results and its
model's clean activations, so keeping every run of a 9-run sweep made memory grow per run."""


@dataclass
class _Opened:
    """A run the user has opened: its session, what was saved for it, its average patterns,
    and what the page says about its verdict (where it was read from, or how to get one)."""

    name: str
    task: str
    session: ExploreSession
    saved: SavedResults
    thumbnails: dict[str, list[list[float]]]
    note: str = ""
    verdict_note: str = ""


class Explorer:
    """The explorer of one run, or of the runs of a sweep (one opened at a time).

    Args:
        runs: The runs the picker offers (see :func:`explorable_runs`).
        n_eval: Evaluation sequences per run.
        method: Initial ablation method.
        seed: Seed of the "draw another sequence" generator.
        threads: torch threads while answering (then restored); None: ``--threads`` /
            ``$MHAINTERP_THREADS``, else 1 (:func:`mhainterp.runtime.work_threads`); 0 keeps
            torch's setting. One, because these models are small, and on a few busy cores
            handing each small matmul to a second thread costs more than it gains (measured:
            10 ms vs 140 ms per click on 2 loaded cores; see analysis/bench_explore.py).
    """

    def __init__(
        self,
        runs: list[RunEntry],
        *,
        n_eval: int = DEFAULT_N_EVAL,
        method: Method = "zero",
        seed: int = 0,
        threads: int | None = None,
    ) -> None:
        if not runs:
            raise invalid("runs", runs, "a non-empty list of runs to explore")
        self.runs = {entry.id: entry for entry in runs}
        self.n_eval = n_eval
        self._method = method
        self._generator = torch.Generator().manual_seed(seed)
        self._opened: OrderedDict[str, _Opened] = OrderedDict()
        self._closed: dict[str, list[str]] = {}  # run -> its ablated heads when dropped
        self._current: _Opened | None = None
        self._example = 0
        self.threads = threads
        self._lock = threading.RLock()  # one request at a time (a session is a mutable state)
        self._jobs = ClickJobs()

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], **options: Any) -> Explorer:
        """The explorer of a run folder or a sweep folder; opens :func:`default_run` (the largest
        head count of the first task)."""
        runs = explorable_runs(path)
        explorer = cls(runs, **options)
        explorer.open(default_run(runs).id)
        return explorer

    @classmethod
    def from_model(
        cls,
        model: HookedModel,
        data: Any,
        *,
        name: str = "model",
        saved: SavedResults | None = None,
        task: str | None = None,
        importance: ImportanceSource | None = None,
        verdict_note: str | None = None,
        **options: Any,
    ) -> Explorer:
        """The explorer of an in-memory model on ``data`` (a Task or Batch).

        Args:
            model: Our own model, or a pretrained one (``load_pretrained``) with a text batch.
            data: A Task or a Batch.
            name: What the page calls the model.
            saved: Per-head results to show (default: none; see :class:`SavedResults`).
            task: What the page calls the data (default: the task's name, or ``"Batch"``).
            importance: ``"exact"`` or ``"attribution"`` (default: see
                :class:`ExploreSession`).
            verdict_note: What the page says about the verdict (default: where the findings
                come from, or that none was saved and the command that saves one).
            **options: The explorer's (``n_eval``, ``method``, ``seed``, ``threads``).
        """
        explorer = cls([RunEntry(id=name, path=Path("."), n_heads=None, seed=None)], **options)
        task = task or getattr(data, "name", type(data).__name__)
        with work_threads(explorer.threads):
            session = ExploreSession(
                model,
                data,
                n_eval=explorer.n_eval,
                method=explorer._method,
                importance=importance,
            )
        saved = saved or SavedResults()
        if verdict_note is None and saved.has_verdict:
            verdict_note = ""
        elif verdict_note is None:  # in memory: the folder is not known here
            pretrained = isinstance(model, BridgedModel)
            verdict_note = no_verdict_note(*((name, "stdlib") if pretrained else ("RUN_FOLDER",)))
        explorer._install(name, task, session, saved, _note(model), verdict_note)
        return explorer

    @classmethod
    def from_text(
        cls,
        model: BridgedModel,
        text: str | os.PathLike[str],
        *,
        n_eval: int = TEXT_N_EVAL,
        max_len: int = 48,
        verdict: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Explorer:
        """The explorer of a pretrained model on the first ``n_eval`` sentences of ``text``
        (``"stdlib"`` or a text file, one sentence per line; see
        :func:`~mhainterp.tasks.text.text_batch`), its first answer computed.

        ``verdict``: the folder ``mhainterp specialize --model NAME --out FOLDER`` wrote
        (:func:`~mhainterp.analyze.pretrained_verdict.specialize_pretrained`): each head's
        finding is shown beside its card (read, never recomputed). Without it the page says
        that no verdict was saved and how to get one.
        ``options``: :meth:`from_model`'s (``method``, ``importance``, ``threads``, ...).

        Raises:
            ParameterError: ``verdict`` is not a pretrained verdict folder, or one of another
                model.
        """
        from mhainterp.analyze.pretrained import sentences_of
        from mhainterp.tasks.text import text_batch

        n_eval = check_int("n_eval", n_eval, minimum=1)
        saved = None if verdict is None else pretrained_verdict(model, verdict)
        batch = text_batch(model, sentences_of(text)[:n_eval], max_len=max_len)
        folder = (getattr(model, "provenance", None) or {}).get("folder") or "model"
        shown = "stdlib sentences" if str(text) == "stdlib" else Path(text).name
        name = Path(str(folder)).name
        note = f"findings from {verdict}" if saved is not None else no_verdict_note(name, text)
        options = {"name": name, "task": shown, "saved": saved, "verdict_note": note, **options}
        explorer = cls.from_model(model, batch, n_eval=len(batch), **options)
        explorer.state()  # attribution and patterns now, so the first request is fast
        return explorer

    # -- runs ----------------------------------------------------------------------------------
    @property
    def session(self) -> ExploreSession:
        """The session of the run on show."""
        assert self._current is not None
        return self._current.session

    def open(self, run_id: str) -> None:
        """Show run ``run_id``: its session is kept with its ablated heads (the
        :data:`OPEN_RUNS` most recently shown; an older one is loaded again, same heads)."""
        from mhainterp.training import load_run

        if run_id not in self.runs:
            raise BadRequestError(f"run={run_id!r} is invalid: one of {', '.join(self.runs)}")
        if run_id in self._opened:
            self._opened.move_to_end(run_id)
            self._current = self._opened[run_id]
            self._current.session.method = self._method
            self._example = 0
            return
        entry = self.runs[run_id]
        with work_threads(self.threads):
            try:
                run = load_run(entry.path)
            except Exception as error:  # a damaged file: name the folder, keep serving others
                raise ValueError(
                    f"cannot load the run {entry.path}: {error} (train it again, or restore "
                    "its files)"
                ) from None
            session = ExploreSession(run.model, run.task, n_eval=self.n_eval, method=self._method)
        session.set(self._closed.pop(run_id, []))  # as it was left when its session was dropped
        saved = SavedResults.load(entry.path)
        verdict_note = "" if saved.has_verdict else no_verdict_note(str(entry.path))
        self._install(run_id, run.task.name, session, saved, verdict_note=verdict_note)

    def _install(
        self,
        name: str,
        task: str,
        session: ExploreSession,
        saved: SavedResults,
        note: str = "",
        verdict_note: str = "",
    ) -> None:
        with work_threads(self.threads):
            thumbnails = session.average_patterns()
        opened = _Opened(name, task, session, saved, thumbnails, note, verdict_note)
        self._opened[name] = self._current = opened
        self._example = 0
        while len(self._opened) > OPEN_RUNS:
            dropped, old = self._opened.popitem(last=False)
            self._closed[dropped] = old.session.heads

    # -- requests ------------------------------------------------------------------------------
    def handle(self, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer one request; raises :class:`BadRequestError` for bad input (state unchanged)."""
        body = body if isinstance(body, dict) else {}
        if action not in ACTIONS:
            raise BadRequestError(f"action={action!r} is invalid: one of {', '.join(ACTIONS)}")
        if action == "exact":
            return self._exact(_field(body, "job", int))
        job = None
        if action in CHANGES:
            self._check_change(action, body)  # a refused click cancels nothing
            job = self._jobs.new()  # a running exact forward stops at its next layer
        with self._lock, work_threads(self.threads):
            answer = self._handle(action, body, job)
        release_free_memory()
        return answer

    def _check_change(self, action: str, body: dict[str, Any]) -> None:
        """Refuse a bad change before it cancels the current job (cheap: no forward)."""
        try:
            if action == "toggle":
                resolve_heads(self.session.model, _field(body, "head", str))
            elif action == "run" and _field(body, "run", str) not in self.runs:
                raise BadRequestError(
                    f"run={body['run']!r} is invalid: one of {', '.join(self.runs)}"
                )
            elif action == "method":
                self._check_method(_field(body, "method", str))
        except BadRequestError:
            raise
        except (ValueError, TypeError) as error:  # resolve_heads on an unknown head
            raise BadRequestError(str(error)) from None

    def _methods(self) -> list[str]:
        """The methods this batch can run: mean and resample need two sequences (one
        sequence's mean, or its only other sequence, is its own z)."""
        n = len(self.session.batch)
        return [m for m in METHODS if METHODS[m].refusal(n) is None]

    def _check_method(self, method: str) -> None:
        if method not in METHODS:
            raise BadRequestError(f"method={method!r} is invalid: one of {', '.join(METHODS)}")
        refusal = METHODS[method].refusal(len(self.session.batch))
        if refusal is not None:  # refused before it is set: a stuck state refused every click
            raise BadRequestError(f"method={method!r} is invalid here: {refusal}")

    def _exact(self, job: int) -> dict[str, Any]:
        """The exact view of click ``job``, or ``{"job", "cancelled": true}`` when a newer
        click came first: then its forward is skipped, or stopped at the next layer."""
        cancelled = {"job": job, "cancelled": True}
        if self._jobs.is_stale(job):
            return cancelled
        with self._lock, work_threads(self.threads):
            if self._jobs.is_stale(job):  # a newer click came while this one waited its turn
                return cancelled
            try:
                with self._jobs.watching(self.session.model, job):
                    view = self.view()
            except ClickCancelled:
                return cancelled
        release_free_memory()
        return {**view, "job": job}

    def _handle(self, action: str, body: dict[str, Any], job: int | None) -> dict[str, Any]:
        try:
            if action == "state":
                return self.state()
            if action == "run":
                self.open(_field(body, "run", str))
                return self.state()
            if action == "toggle":
                self.session.toggle(_field(body, "head", str))
                if body.get("estimate") is True and self.session.estimate() is not None:
                    return self.estimate_view(job)
            elif action == "method":
                method = _field(body, "method", str)
                self._check_method(method)  # before the state changes
                self.session.method = method
                self._method = method
            elif action == "reset":
                self.session.reset()
            elif action == "example":
                self._example = self._pick_example(body)
            elif action == "verify":  # idle work: a click stops it as it stops a stale job
                current = self._jobs.current
                try:
                    with self._jobs.watching(self.session.model, current):
                        self.session.verify_estimates()
                except ClickCancelled:
                    return {"cancelled": True}
            elif action == "attention":
                query = _field(body, "query", int)
                return {
                    "index": self._example,
                    "query": query,
                    "attention": self.session.attention(self._example, query),
                }
            return self.view()
        except BadRequestError:
            raise
        except (ValueError, TypeError) as error:  # e.g. resolve_heads on an unknown head
            raise BadRequestError(str(error)) from None

    def state(self) -> dict[str, Any]:
        """Everything the page draws: runs, the head grid, and the current view."""
        opened = self._current
        assert opened is not None
        model = opened.session.model
        heads = [
            {
                "label": label,
                "layer": layer,
                "head": head,
                "role": opened.saved.labels.get(label),
                "finding": opened.saved.findings.get(label),
                "division": opened.saved.division.get(label, []),
            }
            for layer in range(model.cfg.n_layers)
            for head in range(model.cfg.n_heads)
            for label in [head_label(layer, head)]
        ]
        return {
            "runs": [
                {"id": e.id, "n_heads": e.n_heads, "seed": e.seed} for e in self.runs.values()
            ],
            "run": opened.name,
            "task": opened.task,
            "n_layers": model.cfg.n_layers,
            "n_heads": model.cfg.n_heads,
            "n_eval": len(opened.session.batch),
            "causal": bool(getattr(model.cfg, "causal", False)),
            "objective": opened.session.objective,
            "note": opened.note,
            "metric": {
                "loss": LOSS_NAMES.get(opened.session.objective, "loss"),
                "accuracy": opened.session.objective != "embedding",
            },
            "axes": [{"key": a, "name": axis_title(a)} for a in opened.session.axes],
            "importance": {
                "source": opened.session.importance_source,
                "quantity": opened.session.importance_quantity,
            },
            "methods": self._methods(),
            "heads": heads,
            "verdict": {"saved": opened.saved.has_verdict, "note": opened.verdict_note},
            "thumbnails": opened.thumbnails,
            "view": self.view(),
        }

    def estimate_view(self, job: int | None) -> dict[str, Any]:
        """A click's answer before its forward: the ablated heads, the method, the
        attribution estimate of the loss (:meth:`ExploreSession.estimate`, labelled
        ``"source": "attribution"``) and the ``job`` whose exact view ``exact`` answers."""
        session = self.session
        return {
            "method": session.method,
            "ablated": session.heads,
            "estimate": session.estimate(),
            "job": job,
        }

    def view(self) -> dict[str, Any]:
        """What changes with a click: ablated heads, method, metrics, example, importance and,
        for attribution estimates, their agreement with exact ablation so far
        (:meth:`ExploreSession.estimate_check`; None for exact importance)."""
        session = self.session
        return {
            "method": session.method,
            "ablated": session.heads,
            "metrics": session.metrics(),
            "example": session.example(self._example),
            "importance": self.importance(),
            "estimate_check": session.estimate_check(),
        }

    def importance(self) -> dict[str, float]:
        """Single-head importance for the current method (see
        :meth:`ExploreSession.importance`): a run's saved change in accuracy, else computed
        once."""
        assert self._current is not None
        session = self.session
        saved = self._current.saved.importance.get(session.method)
        exact_accuracy = (session.importance_source, session.importance_quantity) == (
            "exact",
            "accuracy",
        )
        if exact_accuracy and saved and set(saved) == set(session.valid_heads):
            return saved
        return session.importance()

    def _pick_example(self, body: dict[str, Any]) -> int:
        n = len(self.session.batch)
        if body.get("draw"):
            return int(torch.randint(n, (1,), generator=self._generator))
        index = body.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise BadRequestError(f"index={index!r} is invalid: an integer in [0, {n})")
        return index


def no_verdict_note(where: str, text: str | os.PathLike[str] | None = None) -> str:
    """What the page says once when no verdict was saved: that, and the command that saves
    one (for a pretrained model, ``where`` is its name and ``text`` what it reads).

    Example:
        >>> no_verdict_note("runs/rev/runs/h4_seed0")[:60]
        'No saved verdict, so no finding per head: `mhainterp special'
    """
    lead = "No saved verdict, so no finding per head"
    if text is None:
        return f"{lead}: `mhainterp specialize {where}` saves one; open the explorer again."
    folder = f"runs/{where}"
    return (
        f"{lead}: `mhainterp specialize --model {where} --text {text} --out {folder}` saves "
        f"one; then `mhainterp explore --model {where} --verdict {folder}`."
    )


def pretrained_verdict(model: HookedModel, folder: str | os.PathLike[str]) -> SavedResults:
    """The per-head results of ``folder``, a pretrained model's verdict
    (:func:`~mhainterp.analyze.pretrained_verdict.specialize_pretrained`) of ``model``.

    Raises:
        ParameterError: ``folder`` holds no pretrained verdict, or one of another model's
            weights (its ``provenance.json`` names another source).
    """
    from mhainterp.analyze.pretrained_verdict import is_pretrained_folder
    from mhainterp.io import read_json

    if not is_pretrained_folder(folder):
        raise invalid("verdict", str(folder), "a folder `mhainterp specialize --model` wrote")
    try:
        source = read_json(Path(folder) / "provenance.json").get("source")
    except (OSError, ValueError, AttributeError):
        source = None
    own = (getattr(model, "provenance", None) or {}).get("source")
    if source is not None and own is not None and source != own:
        raise invalid("verdict", str(folder), f"the verdict of this model ({own}), not of {source}")
    return SavedResults.load(folder)


def _note(model: HookedModel) -> str:
    """What the page says about a pretrained model's weights (source, quantisation)."""
    provenance = getattr(model, "provenance", None) or {}
    if not provenance:
        return ""
    source = provenance.get("upstream") or provenance.get("source", "")
    quantisation = provenance.get("quantisation")
    return f"{source} · weights: {quantisation}" if quantisation else str(source)


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind):
        raise BadRequestError(f"{name}={value!r} is invalid: a {kind.__name__} is required")
    return value


def answer_message(explorer: Explorer, message: Any) -> dict[str, Any]:
    """The reply to one widget message ``{id, action, body}``: ``{id, status, body}``.

    Example:
        >>> answer_message(explorer, {"id": 1, "action": "reset"})["status"]  # doctest: +SKIP
        200
    """
    if not isinstance(message, dict):
        return {"id": None, "status": 400, "body": {"error": "a message must be a JSON object"}}
    try:
        body = explorer.handle(str(message.get("action")), message.get("body"))
        # the widget's messages are JSON too: a NaN would make the page's parse fail
        return {"id": message.get("id"), "status": 200, "body": json_ready(body)}
    except BadRequestError as error:
        return {"id": message.get("id"), "status": 400, "body": {"error": str(error)}}
