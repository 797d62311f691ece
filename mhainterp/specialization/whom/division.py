"""Whom do the heads serve? Damage profiles over the inputs and outputs, against nulls.

A head can attend to a relation and still serve every input alike, or serve only some query
tokens, positions, target classes or targets. :func:`division_of_labour` measures the second
axis of "specialize" (DESIGN.md, "The question the toolkit answers") along four **axes**:

=================  ===================================================================
``token``          the query token's id at the scored position
``position``       the query position
``target_class``   the class the model must output there
``target``         which target (multi-target models only; generalises
                   :mod:`mhainterp.specialization.whom.causal`)
=================  ===================================================================

**One pass.** The ablation engine runs the clean model and every single-head ablation in one
batched pass with per-position outputs (:func:`mhainterp.ablation.evaluate_head_sets`,
``per_position=True``). That gives, for every head ``h`` and every scored (sequence, position,
target) *triple* ``i``, the damage ``x_hi = clean_correct_i - ablated_correct_hi`` (in
{-1, 0, 1}) and the loss increase. Everything below is arithmetic on these ``[H, N]`` tables.

**Damage profile.** For axis value ``v`` with ``n_v`` scored triples, ``d_hv`` is the mean of
``x_hi`` over those triples: the accuracy lost on ``v``. It is clipped at 0 (an ablation that
helps a value is no damage). Each value weighs the same in what follows whatever its ``n_v``
(the question is which values a head serves, not how frequent they are); values with fewer
than ``min_count`` triples are kept in :attr:`DivisionResult.profiles` but left out of the
indices and of ``serves``, and the noise of the rarer values that remain is in the permutation
null, which keeps every ``n_v``.

**No damage, no profile.** A head whose overall accuracy drop (over all scored triples) is below
the *damage gate* serves nothing along any axis: its selectivity is NaN (undefined, not maximal),
``specialized`` is False and ``serves`` is empty; the backup and group tests speak for it. The
gate is ``min_damage`` (0.01), raised to the largest overall damage of any head of the untrained
twins (below) when that is larger: damage the architecture does without training is no work
done. A head must also raise the mean cross-entropy by ``min_loss_increase`` (0.01 nats):
an accuracy drop alone can be argmax flips at near-ties, which untrained models, whose logits
are nearly flat, are full of. (Tiny untrained models, e.g. d_model 32 on 8 positions, flip a
few percent of argmaxes when a head is removed, and that damage sits on one position or token:
concentrated, hence "selective", but meaningless.) ``settings["damage_gate"]`` is the gate used.

**Selectivity index** of a head over the ``K`` kept values of an axis, with
``p_v = d_v / sum_u d_u``::

    SI = 1 - H(p) / log K,   H(p) = -sum_v p_v log p_v

0 when the damage is spread evenly, 1 when it falls on a single value, and
``1 - log m / log K`` when it falls evenly on ``m`` of the ``K`` values. Chosen over the
max-based index of :mod:`~mhainterp.specialization.whom.causal`, ``(K max(d) / D - 1) / (K - 1)``,
because that one only sees the largest value: a head serving half of ten tokens scores 0.11 on
it and 0.30 here, so "serves a subset" is not drowned by the number of values.

**Nulls.** (a) *Labels permuted within the data*: the axis values are shuffled among the scored
triples (one permutation of the triples, the same for every head, so each head keeps its damage
per triple and heads keep their joint structure); the profiles and indices are recomputed from
the shuffled means, ``M`` times. ``p = (1 + #{null >= observed}) / (1 + M)``, so no p is
below ``1 / (1 + M)``: with ``m`` tests under Holm the smallest adjusted p is at least
``m / (1 + M)``, and at M = 1000 a model with more than 50 head x axis tests could call no head
specialized (measured: 24 heads that each serve one token, 72 tests, min p_adj 0.072). So
``M = max(n_permutations, ceil(2 m / alpha))``, which lets a head beyond every draw pass
(``settings["n_null_draws"]`` is the M used). By default (``null="normal"``) the shuffled
per-value sums are drawn from their normal approximation, whose mean and covariance are the
permutation's exact ones (sampling without replacement; :func:`normal_null_means`): O(M H K)
work, so M = 1000 costs milliseconds.
``null="exact"`` draws M real permutations of the triples as tensor ops on the ``[H, N]`` table
(O(M H N); about 1 s for 8 heads x 16k triples) and is what the tests check the default
against. (b) *Untrained matched-seed models*
(:func:`~.where.nulls.matched_seeds`: the run's seed, +1, ...) run through the
same statistic on the first ``n_init_eval`` (128) sequences: one engine pass per seed, so
``n_init`` is small by default (2). Their heads almost never do damage, so their index is
usually NaN; where defined, its mean is reported (``null_init_mean``) and raises the effect
gate, and their largest damage raises the damage gate (below).

**Specialized** = ``p_adj < alpha`` (Holm over every head x axis with a defined index) **and**
``selectivity - max(null_mean, null_init_mean) >= min_gain`` (the NaN one left out). The
effect-size gate is needed: on tens of thousands of scored triples a head that is 0.01 more
selective than its null is "significant" (issue 10 measured 0.004-0.036 at h=4 on
count_previous). The default ``min_gain = 0.05`` is about a head that spares one value in ten
(``1 - log 9 / log 10 = 0.046``) on top of the null.

**Serves.** For a specialized head, the values ``v`` with ``d_v >= serve_share * max(d)`` and
``z_v = (d_v - mean_null_v) / sd_null_v >= Phi^-1(1 - alpha / K)`` (each value's damage against
its own permutation null, Bonferroni over the K values), comma-separated. Empty for a head that
is not specialized: a head that serves every value alike serves no subset.

**Caveat: fragile values.** A value that removing *any* head hurts more (on count_previous,
the target classes 2-4, which need exact counting) makes every head look selective against the
label-permutation null, which treats values as exchangeable. The division index does not count
it (all heads then damage the same values); read ``serves`` together with the index.

**Division index** of a model along an axis: how complementary the damage profiles of the
heads that do damage are::

    DI = 1 - mean_{g != h} cos(d_g, d_h)

over pairs of damaging heads (profiles clipped at 0, so ``cos`` is in [0, 1]): 0 when every head
damages the same values in the same proportions (eight heads that all serve every token), 1 when
their damaged values are disjoint; NaN with fewer than 2 damaging heads. Against the same two
nulls (``null_index``, ``p``; ``divided`` = ``p < alpha`` and
``index - max(null_index, null_init_index) >= min_gain``).

**Attention-side view** (:attr:`DivisionResult.attention`): per head, query token (and query
position) and relation template of the task, the share of attention on the template at the
scored queries with that value, over the first ``n_attention`` (256) sequences (patterns from
capture's :func:`~mhainterp.capture.iter_patterns`): where a head looks for each token.

Modules: this one computes (settings, the engine pass, the nulls, the tables);
:mod:`~mhainterp.specialization.whom.division_result` holds the result, its columns and its files;
:mod:`~mhainterp.specialization.whom.division_attention` the attention-side view;
:mod:`~mhainterp.specialization.whom.selectivity` the indices and nulls; and
:mod:`~mhainterp.specialization.whom.damage` the per-triple damage.

Shapes: H heads (all layers), N scored triples, K values of an axis, M permutations, C = 1 + H
configurations, n sequences, T positions, k targets.

Example:
    >>> from mhainterp.handbuilt_split import split_heads_model, split_batch
    >>> model = split_heads_model([("target", [0, 1, 2, 3]), ("target", [4, 5, 6, 7, 8])])
    >>> result = division_of_labour(model, split_batch(256), method="zero",
    ...                             n_permutations=200, n_init=0)
    >>> result.heads.query("by == 'target_class'")["serves"].tolist()
    ['0,1,2,3', '4,5,6,7,8']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.ablation import Method, check_method
from mhainterp.data import Data, as_batch, batch_for_model, target_names
from mhainterp.specialization.corrections import CORRECTIONS, adjust_pvalues
from mhainterp.specialization.where.nulls import init_models, matched_seeds
from mhainterp.specialization.whom.damage import TripleDamage, triple_damage
from mhainterp.specialization.whom.division_attention import ATTENTION_AXES, attention_view
from mhainterp.specialization.whom.division_result import (
    ATTENTION_COLUMNS,
    HEADS_COLUMNS,
    INDEX_COLUMNS,
    PROFILE_COLUMNS,
    DivisionResult,
    join_columns,
    saved_division,
)
from mhainterp.specialization.whom.selectivity import (
    division_index,
    entropy_selectivity,
    exact_null_means,
    normal_null_means,
)
from mhainterp.tasks import Batch, Task
from mhainterp.validation import check_float, check_int, check_option, invalid

__all__ = [
    "ATTENTION_AXES",
    "AXES",
    "DIVISION_DEFAULTS",
    "HEADS_COLUMNS",
    "INDEX_COLUMNS",
    "PROFILE_COLUMNS",
    "ATTENTION_COLUMNS",
    "DivisionResult",
    "TripleDamage",
    "division_index",
    "division_of_labour",
    "division_request",
    "entropy_selectivity",
    "saved_division",
    "triple_damage",
]

AXES: tuple[str, ...] = ("token", "position", "target_class", "target")
"""The axes of :func:`division_of_labour` (see the module docstring)."""

DIVISION_DEFAULTS: dict[str, Any] = {
    "method": "mean",
    "min_damage": 0.01,
    "min_loss_increase": 0.01,
    "min_gain": 0.05,
    "min_count": 10,
    "serve_share": 0.5,
    "alpha": 0.05,
    "correction": "holm",
    "n_permutations": 1000,
    "n_init": 2,
    "n_init_eval": 128,
    "n_attention": 256,
    "seed": 0,
    "null": "normal",
}
"""Default thresholds (see the module docstring for what each gate means)."""

DERIVED = ("p_adj", "specialized", "serves")  # heads columns computed over all axes at once


NULLS = ("normal", "exact")


@dataclass
class _Settings:
    method: str
    min_damage: float
    min_loss_increase: float
    min_gain: float
    min_count: int
    serve_share: float
    alpha: float
    correction: str
    n_permutations: int
    n_init: int
    n_init_eval: int
    n_attention: int
    seed: int
    null: str


def _resolve_settings(settings: Any, given: dict[str, Any]) -> _Settings:
    """Explicit keywords, else the fields ``settings`` has, else :data:`DIVISION_DEFAULTS`."""
    shared = ("alpha", "correction", "min_damage", "seed")  # SpecializationSettings' fields
    values = dict(DIVISION_DEFAULTS)
    if settings is not None:
        for name in shared:
            if hasattr(settings, name):
                values[name] = getattr(settings, name)
        if hasattr(settings, "ablation_method"):
            values["method"] = settings.ablation_method
    values.update({k: v for k, v in given.items() if v is not None})
    s = _Settings(**values)
    check_method(s.method)
    check_float("min_damage", s.min_damage, minimum=0.0)
    check_float("min_loss_increase", s.min_loss_increase)
    check_float("min_gain", s.min_gain, minimum=0.0, maximum=1.0)
    check_int("min_count", s.min_count, minimum=1)
    check_float("serve_share", s.serve_share, minimum=0.0, maximum=1.0)
    check_float("alpha", s.alpha, minimum=0.0, maximum=1.0)
    check_option("correction", s.correction, CORRECTIONS)
    check_int("n_permutations", s.n_permutations, minimum=1)
    check_int("n_init", s.n_init, minimum=0)
    if s.n_init == 1:
        raise invalid("n_init", 1, "0 (no initialisation null) or an integer >= 2")
    check_int("n_init_eval", s.n_init_eval, minimum=1)
    check_int("n_attention", s.n_attention, minimum=1)
    check_int("seed", s.seed, minimum=0)
    check_option("null", s.null, NULLS)
    return s


def _normalise_by(by: Sequence[str] | str) -> list[str]:
    """``by`` as a list of known axes without repeats (``"token,position"`` is split)."""
    parts = [p.strip() for p in by.split(",") if p.strip()] if isinstance(by, str) else list(by)
    axes: list[str] = []
    for axis in parts:
        check_option("by", axis, AXES)
        if axis not in axes:
            axes.append(axis)
    if not axes:
        raise invalid("by", by, f"one or more of {', '.join(AXES)}")
    return axes


def division_request(settings: Any = None, by: Sequence[str] | str = AXES, **given: Any) -> dict:
    """What a saved result must have been made with to be reused: the resolved thresholds and
    the axes asked for (compared with the saved ``settings``).

    Example:
        >>> division_request(by="token")["by_asked"]
        ['token']
    """
    return {**_resolve_settings(settings, given).__dict__, "by_asked": _normalise_by(by)}


def _axes_that_apply(
    by: Sequence[str] | str, td: TripleDamage, n_targets: int, min_count: int
) -> tuple[list[str], dict[str, str]]:
    """The asked axes that apply, and why each other one is skipped."""
    axes = _normalise_by(by)
    kept, skipped = [], {}
    for axis in axes:
        counts = td.onehot(axis).sum(0)
        if axis == "target" and n_targets < 2:
            skipped[axis] = "a single-target model"
        elif int((counts >= min_count).sum()) < 2:
            skipped[axis] = f"fewer than 2 values with >= {min_count} scored triples"
        else:
            kept.append(axis)
    return kept, skipped


@dataclass
class _AxisStats:
    """Observed statistics of one axis and their permutation null."""

    keep: Bool[Tensor, " K"]
    profile: Float[Tensor, "H K"]  # mean damage per value (unclipped, all values)
    selectivity: Float[Tensor, " H"]
    null_mean: Float[Tensor, " H"]
    p: Float[Tensor, " H"]
    z: Float[Tensor, "H K"]  # each value's damage against its own permutation null
    index: float
    null_index: float
    null_index_std: float
    p_index: float


def _axis_stats(profile: Tensor, null_means: Tensor, keep: Tensor, defined: Tensor) -> _AxisStats:
    observed = profile[:, keep]
    null = null_means[..., keep]  # (M, H, K')
    M = null.shape[0]
    si = entropy_selectivity(observed, defined)
    null_si = entropy_selectivity(null, defined)  # (M, H)
    hits = (null_si >= si - 1e-12).double().sum(0)
    p = torch.where(si.isnan(), math.nan, (1 + hits) / (1 + M))
    null_mean = torch.where(si.isnan(), math.nan, torch.nan_to_num(null_si).sum(0) / M)
    mu, sd = null_means.mean(0), null_means.std(0)  # (H, K)
    z = (profile - mu) / sd.clamp(min=1e-12)
    index = float(division_index(observed, defined))
    null_index = division_index(null, defined)  # (M,)
    valid = null_index[~null_index.isnan()]
    if math.isnan(index) or not valid.numel():
        p_index, null_mu, null_sd = math.nan, math.nan, math.nan
    else:
        p_index = float((1 + (valid >= index - 1e-12).sum()) / (1 + M))
        null_mu, null_sd = float(valid.mean()), float(valid.std()) if len(valid) > 1 else 0.0
    return _AxisStats(
        keep=keep, profile=profile, selectivity=si, null_mean=null_mean, p=p, z=z,
        index=index, null_index=null_mu, null_index_std=null_sd, p_index=p_index,
    )  # fmt: skip


def _observed_only(
    td: TripleDamage, axes: Sequence[str], s: _Settings
) -> dict[str, tuple[Tensor, float]]:
    """Per axis: each head's selectivity and the division index (no null): for the
    untrained-model null, which runs the same statistic."""
    defined = (td.total_damage >= s.min_damage) & (td.loss_increase.mean(1) >= s.min_loss_increase)
    out = {}
    for axis in axes:
        onehot = td.onehot(axis)
        counts = onehot.sum(0)
        keep = counts >= s.min_count
        profile = (td.damage @ onehot / counts.clamp(min=1))[:, keep]
        if int(keep.sum()) < 2:
            out[axis] = (torch.full((len(td.heads),), math.nan), math.nan)
            continue
        out[axis] = (entropy_selectivity(profile, defined), float(division_index(profile, defined)))
    return out


# ----------------------------------------------------------------------------- entry point


def division_of_labour(
    model: Any,
    data: Data,
    by: Sequence[str] | str = AXES,
    *,
    method: Method | None = None,
    n_eval: int = 1024,
    settings: Any = None,
    min_damage: float | None = None,
    min_loss_increase: float | None = None,
    min_gain: float | None = None,
    min_count: int | None = None,
    serve_share: float | None = None,
    alpha: float | None = None,
    correction: str | None = None,
    n_permutations: int | None = None,
    n_init: int | None = None,
    n_init_eval: int | None = None,
    n_attention: int | None = None,
    seed: int | None = None,
    null: str | None = None,
    relations: Any = None,
    progress: bool = False,
) -> DivisionResult:
    """Whom each head serves along each axis, and how divided the heads are, against nulls.

    Args:
        model: The model.
        data: A Task (its evaluation set of ``n_eval``), or a Batch (tokens raise: scoring
            needs targets).
        by: Axes (a list or ``"token,position"``); those that do not apply are skipped
            (``target`` on a single-target model, an axis with fewer than 2 values that have
            ``min_count`` triples).
        method: Ablation method (default ``"mean"``; the evaluated batch is the reference).
        n_eval: Size of a Task's evaluation set.
        settings: A :class:`~mhainterp.specialization.SpecializationSettings` (or anything with
            its fields): ``alpha, correction, min_damage, seed, ablation_method`` are taken
            from it unless given here.
        min_damage: Overall accuracy drop below which a head does no damage (0.01).
        min_loss_increase: Mean loss increase (nats) below which a head does no damage (0.01).
        min_gain: Effect gate: selectivity (or index) minus its null (0.05).
        min_count: Scored triples a value needs to count in the indices (10).
        serve_share: A served value's damage is at least this share of the head's largest (0.5).
        alpha: Level for ``p_adj`` (heads) and ``p`` (index) (0.05).
        correction: Multiple-comparison correction over heads x axes (``"holm"``).
        n_permutations: Label permutations (1000; raised to ``2 m / alpha`` for ``m`` head x
            axis tests, so that Holm can pass a head beyond every draw).
        n_init: Untrained matched-seed models (2; 0 = no initialisation null). One engine
            pass each, which is why the default is small.
        n_init_eval: Sequences the untrained models are evaluated on (128).
        n_attention: Sequences of the attention-side view (the first 256 of the batch: a
            descriptive mean, and one pattern capture is as costly as half the engine pass).
        seed: Seed of the permutations.
        null: How the label-permutation null is drawn: ``"normal"`` (default; the normal
            approximation with the permutation's exact mean and covariance, O(M H K), see
            :func:`normal_null_means`) or ``"exact"`` (M random permutations of the N triples,
            O(M H N): about 1 s for 8 heads, 16k triples and M = 1000 on 2 cores).
        relations: Templates of the attention-side view: a Task, a dict of ``[n, T, T]``
            templates aligned with the batch, or ``f(tokens, mask) -> dict``; default the Task
            when ``data`` is one (none for a Batch: the view is empty).
        progress: Progress bars.

    Returns:
        A :class:`DivisionResult`.

    Example:
        >>> result = division_of_labour(run.model, run.task)  # doctest: +SKIP
        >>> print(result.summary_line())  # doctest: +SKIP
    """
    s = _resolve_settings(
        settings,
        dict(
            method=method, min_damage=min_damage, min_loss_increase=min_loss_increase,
            min_gain=min_gain, min_count=min_count,
            serve_share=serve_share, alpha=alpha, correction=correction,
            n_permutations=n_permutations, n_init=n_init, n_init_eval=n_init_eval,
            n_attention=n_attention, seed=seed,
            null=null,
        ),
    )  # fmt: skip
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    names = target_names(data, model.cfg.n_targets)
    td = triple_damage(model, batch, method=s.method, names=names, progress=progress)
    axes, skipped = _axes_that_apply(by, td, model.cfg.n_targets, s.min_count)
    init, init_damage = _init_null(model, batch, names, axes, s, progress)
    # No damage, no profile: below min_damage, or below what an untrained twin's head does.
    gate = max(s.min_damage, init_damage)
    defined = (td.total_damage >= gate) & (td.loss_increase.mean(1) >= s.min_loss_increase)
    onehots = {axis: td.onehot(axis) for axis in axes}
    generator = torch.Generator().manual_seed(s.seed)
    draw = normal_null_means if s.null == "normal" else exact_null_means
    n_draws = _null_draws(s, n_tests=int(defined.sum()) * len(axes))
    null_means = draw(td.damage, onehots, n_draws, generator)
    per_axis: dict[str, _AxisStats] = {}
    for axis in axes:
        counts = onehots[axis].sum(0)
        profile = td.damage @ onehots[axis] / counts.clamp(min=1)  # (H, K)
        per_axis[axis] = _axis_stats(profile, null_means[axis], counts >= s.min_count, defined)
    result = _tables(td, onehots, per_axis, init, defined, s)
    relations = data if relations is None and isinstance(data, Task) else relations
    attention = attention_view(model, batch[: s.n_attention], relations, axes, td)
    meta = {**s.__dict__, "by_asked": _normalise_by(by), "by": list(axes), "damage_gate": gate}
    meta["n_null_draws"] = n_draws
    return DivisionResult(*result, attention=attention, settings=meta, skipped=skipped)


def _null_draws(s: _Settings, n_tests: int) -> int:
    """Label-permutation draws: ``n_permutations``, raised so that the p-value floor
    ``1 / (1 + M)`` times the ``n_tests`` of the correction stays below ``alpha / 2``."""
    return max(s.n_permutations, math.ceil(2 * n_tests / s.alpha))


def _init_null(
    model: Any, batch: Batch, names: list[str], axes: list[str], s: _Settings, progress: bool
) -> tuple[dict[str, tuple[Tensor, float]], float]:
    """The untrained matched-seed models through the same statistic.

    Returns:
        Per axis, the models' mean selectivity per head and mean division index (NaN-aware
        means; NaN where no model has a defined value), and the largest overall damage of any
        of their heads (0 without models).
    """
    H = len(model.head_labels)
    empty = {axis: (torch.full((H,), math.nan), math.nan) for axis in axes}
    if s.n_init == 0 or not axes:
        return empty, 0.0
    part = batch[: s.n_init_eval]
    models = init_models(model.cfg, matched_seeds(model.cfg.seed, s.n_init))
    damages = [
        triple_damage(m, part, method=s.method, names=names)
        for m in tqdm(models, desc="init null", disable=not progress, leave=False)
    ]
    draws = [_observed_only(td, axes, s) for td in damages]
    out = {}
    for axis in axes:
        si = torch.stack([d[axis][0] for d in draws]).double()  # (n_init, H)
        index = np.array([d[axis][1] for d in draws], dtype=float)
        si_mean = torch.where(si.isnan().all(0), math.nan, torch.nanmean(si, 0))
        out[axis] = (si_mean, float(np.nanmean(index)) if np.isfinite(index).any() else math.nan)
    return out, max(float(td.total_damage.max()) for td in damages)


def _baseline(*nulls: float) -> float:
    finite = [v for v in nulls if not math.isnan(v)]
    return max(finite) if finite else math.nan


def _served(st: _AxisStats, values: list[str], s: _Settings) -> list[str]:
    """Per head, the values it serves (comma-separated; see "Serves" in the module docstring):
    a kept value whose damage is at least ``serve_share`` of the head's largest kept damage and
    beats its own permutation null (Bonferroni over the K kept values)."""
    profile = st.profile.double()  # (H, K)
    largest = profile[:, st.keep].clamp(min=0).max(1).values  # (H,)
    z_crit = float(stats.norm.ppf(1 - s.alpha / int(st.keep.sum())))
    serves = st.keep & (profile >= s.serve_share * largest[:, None]) & (st.z >= z_crit)
    return [",".join(values[v] for v in row.nonzero()[:, 0].tolist()) for row in serves]


def _tables(
    td: TripleDamage,
    onehots: dict[str, Tensor],
    per_axis: dict[str, _AxisStats],
    init: dict[str, tuple[Tensor, float]],
    defined: Tensor,
    s: _Settings,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The heads, index and profiles tables, built column-wise (one array per column)."""
    H = len(td.pairs)
    layers = np.array([layer for layer, _ in td.pairs], dtype=int)
    head_ids = np.array([head for _, head in td.pairs], dtype=int)
    labels = np.array(td.heads, dtype=object)
    heads_parts, index_rows, profile_parts = [], [], []
    for axis, st in per_axis.items():
        values = td.value_names[axis]
        counts = onehots[axis].sum(0)
        K_all, K = len(values), int(st.keep.sum())
        heads_parts.append(
            {
                "head_label": labels, "layer": layers, "head": head_ids, "by": axis,
                "selectivity": st.selectivity.numpy(), "null_mean": st.null_mean.numpy(),
                "total_damage": td.total_damage.double().numpy(),
                "loss_increase": td.loss_increase.mean(1).double().numpy(),
                "p": st.p.numpy(), "null_init_mean": init[axis][0].double().numpy(),
                "n_values": K, "served": np.array(_served(st, values, s), dtype=object),
            }
        )  # fmt: skip
        clean = td.clean @ onehots[axis] / counts.clamp(min=1)  # (K,)
        loss_profile = td.loss_increase @ onehots[axis] / counts.clamp(min=1)  # (H, K)
        profile_parts.append(
            {
                "head_label": np.repeat(labels, K_all),
                "layer": np.repeat(layers, K_all),
                "head": np.repeat(head_ids, K_all),
                "by": axis,
                "value": np.tile(np.array(values, dtype=object), H),
                "n_scored": np.tile(counts.numpy().astype(int), H),
                "clean_accuracy": np.tile(clean.numpy(), H),
                "ablated_accuracy": (clean[None] - st.profile).numpy().ravel(),
                "damage": st.profile.numpy().ravel(),
                "loss_increase": loss_profile.numpy().ravel(),
                "in_index": np.tile(st.keep.numpy(), H),
            }
        )
        init_index = init[axis][1]
        gain = st.index - _baseline(st.null_index, init_index)
        index_rows.append(
            {
                "by": axis, "index": st.index, "null_index": st.null_index, "p": st.p_index,
                "divided": bool(st.p_index < s.alpha and gain >= s.min_gain)
                if not math.isnan(st.p_index) else False,
                "null_index_std": st.null_index_std, "null_init_index": init_index,
                "n_damaging": int(defined.sum()), "n_values": K,
            }
        )  # fmt: skip
    heads = join_columns(heads_parts, [c for c in HEADS_COLUMNS if c not in DERIVED] + ["served"])
    heads["p_adj"] = adjust_pvalues(heads["p"].astype(float), s.correction)
    gain = heads["selectivity"] - np.fmax(heads["null_mean"], heads["null_init_mean"])
    with np.errstate(invalid="ignore"):  # NaN selectivity: never specialized
        heads["specialized"] = (heads["p_adj"] < s.alpha) & (gain >= s.min_gain)
    # A head that serves every value alike serves no subset: ``serves`` only when specialized.
    heads["serves"] = np.where(heads["specialized"], heads.pop("served"), "").astype(object)
    return (
        pd.DataFrame(heads, columns=HEADS_COLUMNS),
        pd.DataFrame(index_rows, columns=INDEX_COLUMNS),
        pd.DataFrame(join_columns(profile_parts, PROFILE_COLUMNS), columns=PROFILE_COLUMNS),
    )
