"""Attribution: Michel et al.'s gradient head importance, its agreement with ablation, pruning.

Gradient importance is a first-order estimate of what ablation measures; the two are compared
per head (``compare_importance``) and by rank correlation (``importance_agreement``). The
pruning curve removes heads greedily, scored by the ablation engine.

**Attribution patching** (Nanda 2023; Syed et al. 2023) scales this to models of hundreds of
heads: one forward and one backward give, for every head and ablation method at once, the
first-order estimate of the loss change ablation causes,
``grad_z L . (replacement - z)`` summed over the head's slice of ``hook_z``;
:func:`verify_attribution` then ablates the top-k heads and a random sample exactly through
the engine and reports how well the two agree (Spearman, Pearson, top-k overlap).

Example:
    >>> gradient_importance(model, task).sort_values("importance")  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.ablation.engine import (
    evaluate_head_sets,
    head_masks,
    rows_of,
    run_masks,
)
from mhainterp.ablation.plan import length_order
from mhainterp.ablation.replacement import (
    DEFAULT_MAX_ROWS,
    METHODS,
    AttributionSums,
    CleanCache,
    Method,
    build_replacement,
    check_method,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data, as_batch, batch_for_model, target_names
from mhainterp.heads import all_heads, format_heads, head_label, resolve_heads
from mhainterp.protocol import HookedModel
from mhainterp.runtime import eval_mode, uses_work_threads
from mhainterp.scoring import position_scores
from mhainterp.tasks import Batch
from mhainterp.validation import ParameterError, check_int, check_option, invalid

__all__ = [
    "attribution_agreement",
    "attribution_patching",
    "attribution_per_position",
    "ESTIMATE_UNITS",
    "compare_importance",
    "gradient_importance",
    "importance_agreement",
    "prune_curve",
    "verification_plan",
    "verify_attribution",
]


def _per_sequence_loss(
    logits: Tensor, batch: Batch
) -> tuple[Float[Tensor, " s"], Bool[Tensor, " s"]]:
    """Mean cross-entropy of each sequence over its scored triples, and which have any."""
    scores = position_scores(logits, batch.targets, batch.mask)  # (s, T, k)
    counts = scores.scored.sum((1, 2))  # (s,)
    return scores.nll.sum((1, 2)) / counts.clamp(min=1), counts > 0


def _check_next_token(model: HookedModel, why: str) -> None:
    """Refuse an embedding model (MiniLM) where the loss is cross-entropy against the targets:
    its targets are placeholders (0), so the numbers would measure nothing. ``why``: what
    to do instead."""
    if getattr(model.cfg, "objective", "next_token") != "next_token":
        raise invalid("model", type(model).__name__, f"a next-token model ({why})")


def _gate_hook(z: Tensor, hook: Any, *, xi: Float[Tensor, "s h"]) -> Tensor:
    return z * xi[:, None, :, None]


@uses_work_threads
def gradient_importance(
    model: HookedModel,
    data: Data,
    *,
    normalize: bool = True,
    n_eval: int = DEFAULT_N_EVAL,
    batch_size: int = 512,
    progress: bool = False,
) -> pd.DataFrame:
    """Michel et al. (2019) head importance: ``I_h = E_x |dL(x)/d xi_h|``.

    A gate ``xi_h = 1`` multiplies each head's ``hook_z``; ``I_h`` is the absolute derivative of
    a sequence's loss (mean cross-entropy over its scored positions) with respect to the gate,
    averaged over sequences. Each sequence gets its own gate, so one backward pass gives every
    per-sequence derivative exactly. As in the paper, scores are then normalised within each
    layer by their L2 norm (a layer whose scores are all 0 stays 0). The model's parameter
    gradients are not touched.

    Args:
        model: A next-token model (an embedding model's targets are placeholders: use
            :func:`~mhainterp.ablation.head_importance`, which scores its embedding damage).
        data: A Task (its evaluation set of ``n_eval`` sequences) or a Batch.
        normalize: Divide each layer's scores by their L2 norm.
        n_eval: Size of a Task's evaluation set.
        batch_size: Sequences per forward/backward.
        progress: Show a progress bar.

    Returns:
        One row per head with columns ``head_label, layer, head, importance`` (normalised if
        ``normalize``) and ``raw_importance`` (``E|dL/d xi|`` before normalising).

    Example:
        >>> gradient_importance(model, task).sort_values("importance")  # doctest: +SKIP
    """
    _check_next_token(
        model,
        "an embedding model has no targets, only placeholders: use head_importance, which "
        "scores the embedding damage",
    )
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    batch_size = check_int("batch_size", batch_size, minimum=1)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    total = torch.zeros(L, H, dtype=torch.float64, device=batch.device)
    n_sequences = 0
    with eval_mode(model):
        starts = range(0, len(batch), batch_size)
        for start in tqdm(starts, desc="gradient importance", disable=not progress, leave=False):
            part = batch[start : start + batch_size]
            grads, has_scored = _gate_gradients(model, part)  # (s, L, H), (s,)
            total += grads[has_scored].abs().double().sum(0)
            n_sequences += int(has_scored.sum())
    raw = total.cpu() / max(1, n_sequences)  # (L, H), handed back as a table
    scores = raw / raw.norm(dim=1, keepdim=True).clamp(min=1e-30) if normalize else raw
    rows = [
        {
            "head_label": head_label(layer, h),
            "layer": layer,
            "head": h,
            "importance": float(scores[layer, h]),
            "raw_importance": float(raw[layer, h]),
        }
        for layer, h in all_heads(L, H)
    ]
    return pd.DataFrame(rows)


def _gate_gradients(model: HookedModel, part: Batch) -> tuple[Tensor, Tensor]:
    """d(loss of sequence i)/d(gate of head h in sequence i), for every i and head."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    xi = torch.ones(len(part), L, H, device=part.device, requires_grad=True)
    hooks = [
        (f"blocks.{layer}.attn.hook_z", partial(_gate_hook, xi=xi[:, layer])) for layer in range(L)
    ]
    with model.hooks(fwd_hooks=hooks):
        logits = model.logits(part.tokens, part.padding_mask)
    per_seq, has_scored = _per_sequence_loss(logits, part)
    # Sequence i's loss depends only on its own gates, so the gradient of the sum is per-sequence.
    (grads,) = torch.autograd.grad(per_seq.sum(), xi)
    return grads.detach(), has_scored


def compare_importance(
    gradient: pd.DataFrame,
    ablation: pd.DataFrame,
    *,
    ablation_column: str = "delta_loss",
    gradient_column: str = "importance",
) -> pd.DataFrame:
    """Gradient and ablation importance side by side, per head and ablation method.

    Args:
        gradient: From :func:`gradient_importance`.
        ablation: From :func:`head_importance` (one or several methods, stacked).
        ablation_column: The ablation score (default ``delta_loss``: loss increase).
        gradient_column: The gradient score (default the layer-normalised ``importance``).

    Returns:
        Columns ``head_label, layer, head, method, gradient_importance, ablation_importance,
        gradient_rank, ablation_rank`` (rank 1 = most important, within each method).

    Example:
        >>> compare_importance(gradient_importance(m, t), head_importance(m, t))  # doctest: +SKIP
    """
    for name, df, column in (
        ("gradient", gradient, gradient_column),
        ("ablation", ablation, ablation_column),
    ):
        if column not in df.columns:
            raise ParameterError(
                f"{name} is invalid: a table with a {column!r} column, got columns "
                f"{', '.join(map(str, df.columns))}"
            )
    left = gradient[["head_label", "layer", "head", gradient_column]].rename(
        columns={gradient_column: "gradient_importance"}
    )
    right = ablation[["head_label", "method", ablation_column]].rename(
        columns={ablation_column: "ablation_importance"}
    )
    merged = left.merge(right, on="head_label", how="inner", validate="one_to_many")
    by_method = merged.groupby("method", sort=False)
    merged["gradient_rank"] = by_method["gradient_importance"].rank(ascending=False, method="min")
    merged["ablation_rank"] = by_method["ablation_importance"].rank(ascending=False, method="min")
    method_order = {m: i for i, m in enumerate(dict.fromkeys(ablation["method"]))}
    return merged.sort_values(
        ["method", "layer", "head"], key=lambda c: c.map(method_order) if c.name == "method" else c
    ).reset_index(drop=True)


def importance_agreement(
    gradient: pd.DataFrame,
    ablation: pd.DataFrame,
    *,
    ablation_column: str = "delta_loss",
    gradient_column: str = "importance",
) -> pd.DataFrame:
    """Spearman rank correlation between gradient and ablation importance, per method.

    Returns:
        One row per ablation method with columns ``method, ablation_column, gradient_column,
        spearman, p_value, n_heads``. ``spearman`` is NaN when either score is constant.

    Example:
        >>> importance_agreement(gradient_importance(m, t), head_importance(m, t))  # doctest: +SKIP
    """
    merged = compare_importance(
        gradient, ablation, ablation_column=ablation_column, gradient_column=gradient_column
    )
    rows = []
    for method, group in merged.groupby("method", sort=False):
        rho, p_value = _spearman(group["gradient_importance"], group["ablation_importance"])
        rows.append(
            {
                "method": method,
                "ablation_column": ablation_column,
                "gradient_column": gradient_column,
                "spearman": rho,
                "p_value": p_value,
                "n_heads": len(group),
            }
        )
    return pd.DataFrame(rows)


def _spearman(x: pd.Series, y: pd.Series) -> tuple[float, float]:
    if len(x) < 2 or x.nunique() < 2 or y.nunique() < 2:
        return float("nan"), float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.spearmanr(x, y)
    return float(result.statistic), float(result.pvalue)


@uses_work_threads
def prune_curve(
    model: HookedModel,
    data: Data,
    method: Method = "zero",
    reference: Data | None = None,
    *,
    by: Literal["loss", "accuracy"] = "loss",
    rescore: bool = True,
    shortlist: int | None = 8,
    heads: str | list | None = None,
    generator: torch.Generator | None = None,
    n_eval: int = DEFAULT_N_EVAL,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    progress: bool = False,
    cache: CleanCache | None = None,
) -> pd.DataFrame:
    """Greedy pruning: remove the least important head, re-score the rest, repeat.

    At every step each remaining head is scored by ablating it *together with* the heads
    already removed (one batched pass per step); the one whose removal hurts least goes.

    Args:
        model, data, method, reference, generator, n_eval, max_rows, progress: As in
            :func:`mhainterp.ablation.head_importance`; the model a next-token one (an
            embedding model's targets are placeholders).
        by: ``"loss"`` (least important = lowest loss after removal) or ``"accuracy"``
            (highest accuracy; ties broken by lower loss).
        rescore: Re-score after every removal (True) or remove in the order of the first
            scoring, as in Michel et al. (False).
        shortlist: When re-scoring, score only this many candidates: those least important
            at their latest scoring (None: every remaining head). Exact whenever at most
            ``shortlist`` heads remain, so models of up to 8 heads get the full greedy curve;
            a 32-head model costs 32 + 31 x 8 evaluations instead of 528.
        heads: Prune only these heads (labels, pairs or ``"L0H1,L0H3"``; the others stay);
            None: every head. A pretrained model prunes its attribution-verified set.
        cache: A :class:`~mhainterp.ablation.replacement.CleanCache` shared with other tables
            of the same model, batch and reference; None: one of its own, so its steps (33
            passes on 32 heads) share one clean forward per chunk of sequences.

    Returns:
        One row per step, from all heads (step 0, the clean model) to none, with columns
        ``step, n_heads_left, removed, pruned, method, loss, accuracy,
        [accuracy/<target>...]``. ``removed`` is the head removed at that step ("" at step 0)
        and ``pruned`` the heads removed so far (``"L0H1,L0H3"``).

    Example:
        >>> curve = prune_curve(model, task, method="mean")  # doctest: +SKIP
        >>> curve[["n_heads_left", "accuracy"]]  # doctest: +SKIP
    """
    # run_masks scores cross-entropy against the targets: an embedding model's are placeholders
    _check_next_token(
        model,
        "an embedding model has no targets, only placeholders: ablate its heads with "
        "evaluate_head_sets, which scores the embedding damage",
    )
    by = check_option("by", by, ("loss", "accuracy"))
    if shortlist is not None:
        shortlist = check_int("shortlist", shortlist, minimum=1)
    method = check_method(method)
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    ref = batch if reference is None else as_batch(reference, n_eval=n_eval, name="reference")
    cache = CleanCache() if cache is None else cache
    replacement = build_replacement(model, method, ref, generator, max_rows, cache)
    names = target_names(data, model.cfg.n_targets)

    def run(head_sets: list[list[tuple[int, int]]], desc: str) -> list[dict[str, float]]:
        masks = head_masks(model, head_sets)
        sums, _ = run_masks(
            model, batch, masks, replacement, max_rows=max_rows, desc=desc, cache=cache
        )
        return sums.metrics(names)

    if heads is None:
        heads = all_heads(model.cfg.n_layers, model.cfg.n_heads)
    else:
        heads = resolve_heads(model, heads)
    baseline = run([[]], desc="prune")[0]
    rows = [_prune_row(0, len(heads), "", [], method, baseline)]
    if not rescore:
        # Michel et al.: one scoring, then remove in that order (one batched pass).
        singles = run([[h] for h in heads], desc="prune")
        order = [
            heads[i] for i in sorted(range(len(heads)), key=lambda i: _rank_key(singles[i], by))
        ]
        cumulative = run([order[: i + 1] for i in range(len(order))], desc="prune")
        for i, metrics in enumerate(cumulative):
            rows.append(
                _prune_row(
                    i + 1,
                    len(heads) - i - 1,
                    head_label(*order[i]),
                    order[: i + 1],
                    method,
                    metrics,
                )
            )
        return pd.DataFrame(rows)
    remaining, pruned = list(heads), []
    last_key: dict[tuple[int, int], tuple[float, ...]] = {}  # each head's latest score
    for _ in tqdm(heads, desc=f"prune ({method})", disable=not progress, leave=False):
        # Re-score only the `shortlist` heads that were least important at the last scoring
        # (all of them while that many or fewer remain): the ranking moves little per step.
        order = sorted(remaining, key=lambda h: last_key.get(h, ()))
        chosen = order if shortlist is None or not last_key else order[:shortlist]
        candidates = run([[*pruned, h] for h in chosen], desc="prune")
        for head, metrics in zip(chosen, candidates, strict=True):
            last_key[head] = _rank_key(metrics, by)
        # Least important: its removal hurts least (ties: the first in layer-major order).
        pick = min(range(len(chosen)), key=lambda i: (_rank_key(candidates[i], by), chosen[i]))
        remaining.remove(chosen[pick])
        pruned.append(chosen[pick])
        rows.append(
            _prune_row(
                len(pruned),
                len(remaining),
                head_label(*pruned[-1]),
                pruned,
                method,
                candidates[pick],
            )
        )
    return pd.DataFrame(rows)


def _rank_key(metrics: dict[str, float], by: str) -> tuple[float, ...]:
    """Sort key of a removal: by loss, or by accuracy (higher first) then loss."""
    return (metrics["loss"],) if by == "loss" else (-metrics["accuracy"], metrics["loss"])


def _prune_row(
    step: int,
    n_left: int,
    removed: str,
    pruned: list[tuple[int, int]],
    method: Method,
    metrics: dict[str, float],
) -> dict[str, Any]:
    return {
        "step": step,
        "n_heads_left": n_left,
        "removed": removed,
        "pruned": format_heads(pruned),
        "method": method,
        **metrics,
    }


# ----------------------------------------------------------------------------- at scale


@uses_work_threads
def attribution_patching(
    model: HookedModel,
    data: Data,
    methods: tuple[Method, ...] = ("zero", "mean"),
    reference: Data | None = None,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    batch_size: int = 16,
    progress: bool = False,
) -> pd.DataFrame:
    """Every head's estimated loss change under each ablation method, from one backward.

    ``estimate = sum_{seq, pos, d} dL/dz[seq, pos, h, d] * (replacement - z)[seq, pos, h, d]``
    at each layer's ``hook_z``, where ``L`` is the batch's mean cross-entropy (the engine's
    ``loss``) and the replacement is the engine's (:func:`~mhainterp.ablation.engine
    .build_replacement`): 0 for ``"zero"``, the per-position reference mean for ``"mean"``.
    The gradient is shared by every method, so a second method costs nothing more. When the
    batch is its own reference and every method has a closed form
    (:attr:`~mhainterp.ablation.replacement.Replacement.closed_form`: zero and mean do), the
    estimates come from sums over that one pass; otherwise each method's replacement is built
    and applied. The model's parameter gradients are not touched.

    Args:
        model: A next-token model (the embedding objective has zero gradient at the clean
            output, so its first-order estimate is 0: ablate its heads exactly instead).
        data: A Task (its evaluation set of ``n_eval``) or a Batch with targets.
        methods: Ablation methods to estimate (names of
            :data:`~mhainterp.ablation.replacement.METHODS`).
        reference: Where mean/resample values come from; default: the evaluated batch.
        n_eval: Size of a Task's evaluation set.
        batch_size: Sequences per forward + backward (bounds the memory of the logits).
        progress: Show a progress bar.

    Returns:
        One row per (method, head): ``head_label, layer, head, method, attribution`` (the
        estimated ``delta_loss``).

    Example:
        >>> attribution_patching(model, batch).nlargest(5, "attribution")  # doctest: +SKIP
    """
    _check_next_token(
        model,
        "an embedding model's damage has zero gradient at the clean output: use "
        "evaluate_head_sets with a CleanOutputMetric",
    )
    methods = tuple(check_method(m) for m in methods)
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    batch_size = check_int("batch_size", batch_size, minimum=1)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_scored = float(batch.scored.sum())
    order = length_order(batch)  # chunks of similar length, cut after their last real token
    parts = [order[s : s + batch_size] for s in range(0, len(batch), batch_size)]
    if reference is None and all(METHODS[m].closed_form is not None for m in methods):
        estimate = _closed_form_estimates(model, batch, parts, n_scored, methods, progress)
    else:
        ref = batch if reference is None else as_batch(reference, n_eval=n_eval, name="reference")
        cache = CleanCache()
        replacements = {m: build_replacement(model, m, ref, cache=cache) for m in methods}
        estimate = {m: torch.zeros(L, H, dtype=torch.float64, device=batch.device) for m in methods}
        with eval_mode(model):
            for rows in tqdm(parts, desc="attribution", disable=not progress, leave=False):
                part = rows_of(batch, rows)
                zs, grads = _z_and_gradients(model, part, n_scored)
                for method, replacement in replacements.items():
                    for layer in range(L):
                        change = replacement.values(layer, rows, zs[layer]) - zs[layer]
                        per_head = (grads[layer] * change).double().sum((0, 1, 3))  # (h,)
                        estimate[method][layer] += per_head
    estimate = {m: values.cpu() for m, values in estimate.items()}  # for the table
    rows_out = [
        {
            "head_label": head_label(layer, h),
            "layer": layer,
            "head": h,
            "method": method,
            "attribution": float(estimate[method][layer, h]),
        }
        for method in methods
        for layer, h in all_heads(L, H)
    ]
    return pd.DataFrame(rows_out)


def _closed_form_estimates(
    model: HookedModel,
    batch: Batch,
    parts: list[Tensor],
    n_scored: float,
    methods: tuple[Method, ...],
    progress: bool,
) -> dict[Method, Float[Tensor, "L h"]]:
    """Each method's closed-form estimate when the reference is the evaluated batch, from ONE
    pass that accumulates :class:`~mhainterp.ablation.replacement.AttributionSums`.

    The mean replacement ``m[pos, h, d]``, say, is the same for every sequence, so
    ``sum g (m - z) = sum_{pos, d} G m - sum g z`` with ``G = sum_seq g``: the forward that
    gives the gradients also gives the per-position means (the engine's
    :func:`~mhainterp.ablation.replacement.build_replacement` would need a forward of its own).
    """
    L, H = model.cfg.n_layers, model.cfg.n_heads
    T, d_head = batch.tokens.shape[1], model.cfg.d_head
    sums = {"dtype": torch.float64, "device": batch.device}  # accumulated where z lives
    g_dot_z = torch.zeros(L, H, **sums)
    g_sum = torch.zeros(L, T, H, d_head, **sums)  # G, summed over sequences
    z_sum = torch.zeros(L, T, H, d_head, **sums)  # over real tokens
    counts = torch.zeros(T, **sums)
    with eval_mode(model):
        for rows in tqdm(parts, desc="attribution", disable=not progress, leave=False):
            part = rows_of(batch, rows)
            cut, real = part.tokens.shape[1], part.padding_mask.double()  # (s, cut)
            zs, grads = _z_and_gradients(model, part, n_scored)
            counts[:cut] += real.sum(0)
            for layer in range(L):
                z, g = zs[layer].double(), grads[layer].double()  # (s, cut, h, d_head)
                g_dot_z[layer] += (g * z).sum((0, 1, 3))
                g_sum[layer, :cut] += g.sum(0)
                z_sum[layer, :cut] += (z * real[:, :, None, None]).sum(0)
    sums = AttributionSums(g_dot_z, g_sum, z_sum, counts)
    return {m: METHODS[m].closed_form(sums) for m in methods}


def _z_and_gradients(
    model: HookedModel, part: Batch, n_scored: float
) -> tuple[list[Tensor], list[Tensor]]:
    """Each layer's clean ``hook_z`` on ``part`` and ``d(sum nll / n_scored)/dz`` (the part's
    share of the whole batch's mean cross-entropy)."""
    L = model.cfg.n_layers
    zs: list[Tensor] = [None] * L  # type: ignore[list-item]
    shifts: list[Tensor] = [None] * L  # type: ignore[list-item]

    def keep(z: Tensor, hook: Any, layer: int) -> Tensor:
        shift = torch.zeros_like(z, requires_grad=True)  # dL/dshift = dL/dz
        zs[layer], shifts[layer] = z.detach().contiguous(), shift
        return z + shift

    hooks = [(f"blocks.{lay}.attn.hook_z", partial(keep, layer=lay)) for lay in range(L)]
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        logits = model.logits(part.tokens, part.padding_mask)
        scores = position_scores(logits, part.targets, part.mask)
        loss = scores.nll.sum() / n_scored
        grads = torch.autograd.grad(loss, shifts)
    return zs, [g.detach() for g in grads]


ESTIMATE_UNITS = ("single", "kept", "kept_model", "layer", "every")
"""The rows of :func:`attribution_per_position` with ``units="all"``, in order: each head
removed alone (H), kept alone in its layer (H, the contribution above its layer removed),
kept alone in the model (H, above every head removed), each layer removed whole (L), every
head removed (1)."""


@torch.no_grad()
def attribution_per_position(
    model: HookedModel,
    batch: Batch,
    replacements: dict[str, Any],
    *,
    units: Literal["single", "all"] = "single",
    n_probes: int = 8,
    generator: torch.Generator | None = None,
    batch_size: int = 16,
) -> dict[str, Float[Tensor, "U n T"]]:
    """Every head's estimated damage of removing it alone, per (sequence, position), under
    each replacement, from forwards and backwards of the clean model only.

    With ``dz_q`` a head's change ``replacement - z`` at ``hook_z`` position ``q`` and
    ``t_q = grad . dz_q`` (summed over the head's ``d_head`` entries; a change at ``q`` also
    reaches later positions, so the estimate put at ``q`` is an approximate profile):

    - a next-token model: ``grad`` of the batch's **summed** cross-entropy, so ``t_q`` is the
      first-order nll increase (nats) put at ``q``. To first order removals add up, so a head
      kept alone contributes what removing it alone costs, and a layer costs its heads' sum;
    - an embedding model (``cfg.objective == "embedding"``, damage ``1 - cos`` of each
      position's output to the clean one): the damage is quadratic at the clean output (zero
      gradient), ``f(v) = 1/2 |P_perp v|^2 / |o|^2`` of the output change ``v = J dz``, which
      ``n_probes`` Gaussian probes estimate (Hutchinson, ``E[(r . v)^2] = |v|^2``): the backward
      of ``sum_p r_p . o_p`` (``r_p`` orthogonal to the clean output ``o_p``, scaled by
      ``1 / |o_p|``) gives ``t_q`` per probe, and a sequence's ``S = sum_q t_q``. Removing the
      head alone costs ``1/2 mean(S_h^2)`` (cross terms between positions kept); kept alone in
      its layer it contributes ``f(D) - f(D - d_h) = mean(S_D S_h) - 1/2 mean(S_h^2)`` with
      ``D`` its layer's change (the model's, kept alone in the model); a layer costs
      ``1/2 mean(S_D^2)``, every head ``1/2 mean(S_all^2)``. A sequence's estimate is shared
      over its positions in proportion to ``mean(t_q^2)`` of the head (of the layer, for a
      layer).

    Args:
        model: A model satisfying :mod:`mhainterp.protocol`.
        batch: The evaluated batch (with targets for a next-token model).
        replacements: Method name -> a built
            :class:`~mhainterp.ablation.replacement.Replacement` for ``batch``.
        units: ``"single"`` (each head removed alone, ``H`` rows) or ``"all"``
            (:data:`ESTIMATE_UNITS`, ``3H + L + 1`` rows).
        n_probes: Probes of an embedding model's estimate.
        generator: The probes' generator (CPU; default seeded 0).
        batch_size: Sequences per forward and backward.

    Returns:
        Method -> ``[U, n, T]`` estimated damage (0 at padding), heads layer-major.

    Example:
        >>> reps = {"mean": build_replacement(model, "mean", batch)}  # doctest: +SKIP
        >>> attribution_per_position(model, batch, reps)["mean"].sum((1, 2))  # doctest: +SKIP
    """
    check_option("units", units, ("single", "all"))
    L, h = model.cfg.n_layers, model.cfg.n_heads
    n, T = batch.tokens.shape
    embedding = getattr(model.cfg, "objective", "next_token") == "embedding"
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    U = L * h if units == "single" else 3 * L * h + L + 1
    out = {m: torch.zeros(U, n, T, dtype=torch.float64) for m in replacements}
    with eval_mode(model):
        for start in range(0, n, batch_size):
            rows = torch.arange(start, min(start + batch_size, n), device=batch.device)
            part = batch[rows]
            real = part.padding_mask.to(torch.float64).cpu()  # (s, T)
            zs, shifts, output = _output_with_shifts(model, part)
            with torch.enable_grad():
                changes = {
                    m: [r.values(lay, rows, zs[lay]) - zs[lay] for lay in range(L)]
                    for m, r in replacements.items()
                }
                if embedding:
                    probes = _orthogonal_probes(
                        output.detach(), part.padding_mask, n_probes, generator
                    )
                    terms: dict[str, list[Tensor]] = {m: [] for m in changes}
                    for k, probe in enumerate(probes):
                        scalar = (output * probe).sum()
                        grads = torch.autograd.grad(scalar, shifts, retain_graph=k + 1 < n_probes)
                        for m, change in changes.items():
                            terms[m].append(_per_head_terms(grads, change) * real)  # (H, s, T)
                    for m, per_probe in terms.items():
                        t = torch.stack(per_probe)  # (P, H, s, T)
                        out[m][:, rows.cpu()] = _quadratic_units(t, L, units)
                else:
                    scores = position_scores(output, part.targets, part.mask)
                    grads = torch.autograd.grad(scores.nll.sum(), shifts)
                    for m, change in changes.items():
                        t = _per_head_terms(grads, change) * real  # (H, s, T)
                        out[m][:, rows.cpu()] = _linear_units(t, L, units)
    return out


def _output_with_shifts(model: HookedModel, part: Batch) -> tuple[list, list, Tensor]:
    """Each layer's clean ``hook_z`` on ``part``, a zero shift added there (``d/dshift =
    d/dz``), and the model's output, with the graph from the shifts to it."""
    L = model.cfg.n_layers
    zs: list[Tensor] = [None] * L  # type: ignore[list-item]
    shifts: list[Tensor] = [None] * L  # type: ignore[list-item]

    def keep(z: Tensor, hook: Any, layer: int) -> Tensor:
        shift = torch.zeros_like(z, requires_grad=True)  # dL/dshift = dL/dz
        zs[layer], shifts[layer] = z.detach(), shift
        return z + shift

    hooks = [(f"blocks.{lay}.attn.hook_z", partial(keep, layer=lay)) for lay in range(L)]
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        output = model.logits(part.tokens, part.padding_mask)
    return zs, shifts, output


def _linear_units(t: Float[Tensor, "H s T"], L: int, units: str) -> Float[Tensor, "U s T"]:
    """First-order units: removals add up, so kept alone = removed alone."""
    if units == "single":
        return t
    layers = t.reshape(L, -1, *t.shape[1:]).sum(1)
    return torch.cat([t, t, t, layers, layers.sum(0, keepdim=True)])


def _quadratic_units(t: Float[Tensor, "P H s T"], L: int, units: str) -> Float[Tensor, "U s T"]:
    """Second-order units of a damage quadratic at the clean output, from per-probe terms
    (:func:`attribution_per_position`)."""
    P, H, s, T = t.shape
    S = t.sum(-1)  # (P, H, s): each sequence's probe sum
    single = 0.5 * S.pow(2).mean(0)  # (H, s)
    share = t.pow(2).mean(0)  # (H, s, T)
    share = share / share.sum(-1, keepdim=True).clamp(min=1e-300)
    if units == "single":
        return single[..., None] * share
    h = H // L
    S_layer = S.reshape(P, L, h, s).sum(2)  # (P, L, s)
    S_all = S_layer.sum(1, keepdim=True)  # (P, 1, s)
    layer_of = torch.arange(H) // h
    kept = (S_layer[:, layer_of] * S).mean(0) - single  # (H, s)
    kept_model = (S_all * S).mean(0) - single
    t_layer = t.reshape(P, L, h, s, T).sum(2)
    layer_share = t_layer.pow(2).mean(0)
    layer_share = layer_share / layer_share.sum(-1, keepdim=True).clamp(min=1e-300)
    layer = 0.5 * S_layer.pow(2).mean(0)  # (L, s)
    t_all = t_layer.sum(1, keepdim=True)  # (P, 1, s, T)
    all_share = t_all.pow(2).mean(0)
    all_share = all_share / all_share.sum(-1, keepdim=True).clamp(min=1e-300)
    every = 0.5 * S_all.pow(2).mean(0)  # (1, s)
    return torch.cat(
        [
            single[..., None] * share,
            kept[..., None] * share,
            kept_model[..., None] * share,
            layer[..., None] * layer_share,
            every[..., None] * all_share,
        ]
    )


def _per_head_terms(grads: tuple[Tensor, ...], changes: list[Tensor]) -> Float[Tensor, "H s T"]:
    """``grad . change`` summed over each head's ``d_head`` entries, per (sequence, position),
    heads layer-major, in float64 on the CPU."""
    per_layer = [
        (g.double() * c.double()).sum(-1).permute(2, 0, 1)  # (h, s, T)
        for g, c in zip(grads, changes, strict=True)
    ]
    return torch.cat(per_layer).cpu()


def _orthogonal_probes(
    output: Float[Tensor, "s T d"],
    padding_mask: Bool[Tensor, "s T"],
    n_probes: int,
    generator: torch.Generator,
) -> list[Tensor]:
    """Gaussian probes per real position, orthogonal to the clean output there and scaled by
    ``1 / |output|`` (so ``E[(r . v)^2] = |P_perp v|^2 / |o|^2``); drawn on the CPU (the same
    probes on every device)."""
    o = output.double()
    norm = o.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    unit = o / norm
    probes = []
    for _ in range(n_probes):
        r = torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.device)
        r = r - (r * unit).sum(-1, keepdim=True) * unit
        r = r / norm * padding_mask[..., None].to(o.dtype)
        probes.append(r.to(output.dtype))
    return probes


def verify_attribution(
    model: HookedModel,
    data: Data,
    attribution: pd.DataFrame,
    method: Method = "zero",
    reference: Data | None = None,
    *,
    top_k: int = 8,
    n_random: int = 8,
    seed: int = 0,
    n_eval: int = DEFAULT_N_EVAL,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    cache: CleanCache | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Ablate exactly, through the engine, the ``top_k`` heads of ``attribution`` (largest
    estimated loss change for ``method``) and ``n_random`` others drawn with ``seed``.

    Returns:
        One row per verified head, in attribution order: ``head_label, layer, head, method,
        chosen`` (``"top_k"`` or ``"random"``), ``attribution``, ``exact`` (the engine's
        ``delta_loss``), ``baseline_loss``.

    Example:
        >>> estimate = attribution_patching(model, batch)  # doctest: +SKIP
        >>> verify_attribution(model, batch, estimate, top_k=8)  # doctest: +SKIP
    """
    method = check_method(method)
    chosen = verification_plan(attribution, method, top_k=top_k, n_random=n_random, seed=seed)
    result = evaluate_head_sets(
        model,
        data,
        [[], *([label] for label in chosen["head_label"])],
        method,
        reference,
        n_eval=n_eval,
        max_rows=max_rows,
        cache=cache,
        progress=progress,
        desc=f"verify ({method})",
    )
    losses = [m["loss"] for m in result.metrics()]
    out = chosen[["head_label", "layer", "head", "method", "chosen", "attribution"]].copy()
    out["exact"] = [loss - losses[0] for loss in losses[1:]]
    out["baseline_loss"] = losses[0]
    return out.reset_index(drop=True)


def verification_plan(
    attribution: pd.DataFrame,
    method: Method = "zero",
    *,
    top_k: int = 8,
    n_random: int = 8,
    seed: int = 0,
) -> pd.DataFrame:
    """The heads :func:`verify_attribution` ablates exactly: the ``top_k`` largest estimates
    of ``method`` and ``n_random`` of the others drawn with ``seed`` (a sample the top does
    not choose, so the agreement is not measured on the large effects alone).

    Returns:
        ``attribution``'s rows of those heads with ``chosen`` (``"top_k"`` or ``"random"``),
        in attribution order.

    Example:
        >>> table = pd.DataFrame({"head_label": ["L0H0", "L0H1", "L1H0"], "layer": [0, 0, 1],
        ...     "head": [0, 1, 0], "method": "zero", "attribution": [0.1, 0.5, 0.2]})
        >>> verification_plan(table, top_k=1, n_random=1)[["head_label", "chosen"]].values.tolist()
        [['L0H1', 'top_k'], ['L1H0', 'random']]
    """
    top_k = check_int("top_k", top_k, minimum=1)
    n_random = check_int("n_random", n_random, minimum=0)
    table = attribution[attribution["method"] == method]
    if table.empty:
        raise invalid("method", method, "a method the attribution table was estimated for")
    ordered = table.sort_values("attribution", ascending=False, kind="stable")
    top = ordered.head(top_k)
    rest = ordered.iloc[top_k:]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(len(rest), generator=generator)[: min(n_random, len(rest))]
    sample = rest.iloc[sorted(picks.tolist())]
    return pd.concat([top.assign(chosen="top_k"), sample.assign(chosen="random")])


def attribution_agreement(verified: pd.DataFrame) -> pd.DataFrame:
    """How well attribution ranks the verified heads, per method.

    Returns:
        One row per method: ``method, n_verified, spearman, pearson, top_k, top_k_overlap``
        (of the ``top_k`` heads attribution put first, the share that are among the
        ``top_k`` largest exact losses of the verified set), ``max_abs_error``.

    Example:
        >>> t = pd.DataFrame({"method": ["zero"] * 4, "chosen": ["top_k", "top_k", "random",
        ...     "random"], "attribution": [0.9, 0.5, 0.1, 0.0], "exact": [1.0, 0.2, 0.3, 0.0]})
        >>> attribution_agreement(t)[["spearman", "top_k_overlap"]].round(3).values.tolist()
        [[0.8, 0.5]]
    """
    rows = []
    for method, group in verified.groupby("method", sort=False):
        k = int((group["chosen"] == "top_k").sum())
        by_exact = set(group.nlargest(k, "exact").index)
        by_attribution = set(group.nlargest(k, "attribution").index)
        rho, _ = _spearman(group["attribution"], group["exact"])
        pearson = (
            float(group["attribution"].corr(group["exact"])) if len(group) > 1 else float("nan")
        )
        rows.append(
            {
                "method": method,
                "n_verified": len(group),
                "spearman": rho,
                "pearson": pearson,
                "top_k": k,
                "top_k_overlap": len(by_exact & by_attribution) / max(1, k),
                "max_abs_error": float((group["attribution"] - group["exact"]).abs().max()),
            }
        )
    return pd.DataFrame(rows)
