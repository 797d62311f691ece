"""The division test's decisions: gates, the basis, the calls, and the index and heads rows.

Arithmetic on the per-value accuracies of :mod:`~.profiles` (every table ``[B, A, C, K]``: row
0 observed, rows 1.. bootstrap resamples; every axis at once, each padded to K values). The
formulas are in the docstring of :mod:`~mhainterp.specialization.whom.division`.

Shapes: B resamples, A axes, C configurations, K values (the longest axis's), H heads,
G groups, U units of a basis, M methods.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.ablation import METHODS
from mhainterp.heads import head_label
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.whom.profiles import Configs, PassScores, pad_axes
from mhainterp.specialization.whom.selectivity import (
    division_index,
    effective_values,
    helped_share,
    implied_index,
    interval,
    normal_null_means,
    same_function_distance,
    selectivity,
    upper,
)
from mhainterp.stats import adjust_pvalues

__all__ = [
    "BASES",
    "CALLS",
    "Evidence",
    "Gates",
    "SelectivityTest",
    "choose_basis",
    "combine_calls",
    "gates",
    "heads_rows",
    "index_rows",
    "job_rows",
    "restated_axis",
    "selectivity_test",
    "specialized_rule",
    "unit_profiles",
    "zero_artefact",
    "zero_left_out_text",
]

BASES = ("single", "kept", "group")
CALLS = ("divided", "not divided", "cannot tell", "method-dependent")
"""The per-axis calls of the division test (the verdict contract), in the order a headline
names them."""
TOLERANCE = 1e-9  # rounding: identical profiles give an index of +-1e-16, not a split


@dataclass
class Gates:
    """Which profiles are defined under one method (totals over all scored triples).

    Attributes:
        single: ``[H]`` removing the head alone costs ``min_damage`` and ``min_loss_increase``.
        kept: ``[H]`` the head kept alone adds that much above its layer removed (above
            every head removed, for a head kept across layers: ``Configs.kept_across``).
        group: ``[G]`` removing the group costs that much.
        grouped: ``[H]`` the head is in some group.
        damage_alone, kept_contribution: ``[H]`` accuracy; loss_increase: ``[H]`` nats of
            removing the head alone; group_damage: ``[G]`` accuracy.
    """

    single: Bool[Tensor, " H"]
    kept: Bool[Tensor, " H"]
    group: Bool[Tensor, " G"]
    grouped: Bool[Tensor, " H"]
    damage_alone: Float[Tensor, " H"]
    loss_increase: Float[Tensor, " H"]
    kept_contribution: Float[Tensor, " H"]
    group_damage: Float[Tensor, " G"]

    def units(self, basis: str) -> Bool[Tensor, " U"]:
        """The defined units of ``basis`` (group: the groups, then the lone damaging heads)."""
        if basis == "single":
            return self.single
        if basis == "kept":
            return self.kept
        return torch.cat([self.group, self.single & ~self.grouped])


def gates(scores: PassScores, configs: Configs, s: DivisionSettings) -> Gates:
    """The :class:`Gates` of one pass."""
    acc, loss = scores.accuracy.double(), scores.loss.double()
    clean, single, kept, ref = configs.clean, configs.single, configs.kept, configs.kept_ref
    damage = acc[clean] - acc[single]
    contribution = acc[kept] - acc[ref]
    group_damage = acc[clean] - acc[configs.group]
    grouped = torch.tensor(
        [any(p in g for g in configs.groups) for p in configs.pairs], device=acc.device
    )
    md, ml = s.min_damage, s.min_loss_increase
    return Gates(
        single=(damage >= md) & (loss[single] - loss[clean] >= ml),
        kept=(contribution >= md) & (loss[ref] - loss[kept] >= ml),
        group=(group_damage >= md) & (loss[configs.group] - loss[clean] >= ml),
        grouped=grouped,
        damage_alone=damage,
        loss_increase=loss[single] - loss[clean],
        kept_contribution=contribution,
        group_damage=group_damage,
    )


def choose_basis(g: Gates) -> str:
    """``single`` with 2+ heads defined alone, else ``group`` with 2+ defined units (one a
    group), else ``kept`` with 2+ heads defined kept alone, else ``""`` (cannot tell)."""
    if int(g.single.sum()) >= 2:
        return "single"
    if int(g.group.sum()) >= 1 and int(g.units("group").sum()) >= 2:
        return "group"
    if int(g.kept.sum()) >= 2:
        return "kept"
    return ""


def unit_profiles(means: Float[Tensor, "... C K"], configs: Configs, basis: str) -> Tensor:
    """``[..., U, K]`` unclipped profiles of ``basis``'s units (see :meth:`Gates.units`)."""
    clean = means[..., configs.clean, :][..., None, :]  # (..., 1, K)
    single = clean - means[..., configs.single, :]
    if basis == "single":
        return single
    if basis == "kept":
        return means[..., configs.kept, :] - means[..., configs.kept_ref, :]
    return torch.cat([clean - means[..., configs.group, :], single], -2)


@dataclass
class Evidence:
    """Every axis's per-value accuracies (per method, per noisy copy) and observed loss, the
    axes side by side and each padded to the longest axis's K values
    (:func:`~.profiles.pad_axes`), so that one tensor operation serves all axes.

    ``keep`` marks the values of an axis with ``min_count`` triples, never the padding; the
    statistics set the others to 0 (:meth:`kept`), which leaves every cosine and entropy as if
    they were left out (selectivity divides by ``n_values``, not K).
    """

    axes: list[str]
    value_names: dict[str, list[str]]
    counts: dict[str, Tensor]  # per axis (K_a,)
    keep: Bool[Tensor, "A K"]
    means: dict[str, Float[Tensor, "B A C K"]]
    # Per method, the same-function comparisons under that method: a model's accuracies on
    # the even sequences and a same-function model's on the odd ones (a noisy copy; with one
    # copy, the original first)
    null_pairs: dict[str, list[tuple[Float[Tensor, "B A C K"], Float[Tensor, "B A C K"]]]]
    loss: Float[Tensor, "A C K"]
    # How the axes go together on the scored triples (:func:`~.profiles.value_given`)
    given: Float[Tensor, "A A K K"]

    @property
    def n_values(self) -> Int[Tensor, " A"]:
        """Each axis's kept values."""
        return self.keep.sum(-1)

    def kept(self, profiles: Float[Tensor, "... A U K"]) -> Float[Tensor, "... A U K"]:
        """``profiles`` with every value outside ``keep`` set to 0."""
        return torch.where(self.keep[:, None, :], profiles, 0.0)

    def observed(self, method: str, axis: int) -> Float[Tensor, "C K_a"]:
        """Axis ``axis``'s observed accuracies under ``method``, without padding."""
        return self.means[method][0, axis, :, : len(self.value_names[self.axes[axis]])]


def combine_calls(calls: dict[str, str]) -> str:
    """The methods' common call among those that decide, else "method-dependent".

    Example:
        >>> combine_calls({"mean": "divided", "zero": "cannot tell", "resample": "divided"})
        'divided'
        >>> combine_calls({"mean": "divided", "zero": "not divided"})
        'method-dependent'
    """
    decided = {c for c in calls.values() if c != "cannot tell"}
    if not decided:
        return "cannot tell"
    return decided.pop() if len(decided) == 1 else "method-dependent"


def restated_axis(d: dict[str, Any]) -> str:
    """The other axis a division row's index may only restate, or "": on an axis called
    divided (or method-dependent), the index that a divided axis's profiles give this one
    through the data alone (``index_explained``, where the axes go together in the data)
    reaches the index's own 95% interval (``ci_low``, or the index where the interval sits
    above it). Two heads that split the positions look divided by target class too where
    early positions hold small classes.

    Example:
        >>> restated_axis({"by": "target_class", "call": "divided", "index": 0.49,
        ...                "ci_low": 0.45, "explained_by": "position", "index_explained": 0.59})
        'position'
        >>> restated_axis({"by": "position", "call": "divided", "index": 1.0, "ci_low": 1.0,
        ...                "explained_by": "target_class", "index_explained": 0.23})
        ''
    """
    by = d.get("explained_by")
    if d.get("call") not in SERVING:  # nothing claimed to restate
        return ""
    try:  # a row read back from CSV, or one from before the column: text, None, missing
        implied, low = float(d["index_explained"]), float(d["ci_low"])
        low = min(low, float(d["index"]))  # a dispersion's interval can sit above its index
    except (KeyError, TypeError, ValueError):
        return ""
    if not isinstance(by, str) or not by or math.isnan(implied) or math.isnan(low):
        return ""
    return by if implied >= low - TOLERANCE else ""


def zero_artefact(calls: Mapping[str, Any], by: str) -> bool:
    """Whether zero ablation's call on axis ``by`` is the default-class artefact, so that the
    combined call leaves zero out: on the target classes, zero alone calls the axis divided,
    while mean ablation calls it not divided (and resample, where it ran, does not call it
    divided). Mean ablation is zero ablation with each head's per-position mean write put
    back, so a split that zero shows and mean does not lies in those mean writes: removing one
    shifts the logits toward a class (where nothing else writes the readout, toward a tie that
    argmax gives to class 0), which spares that class or hurts the classes the write favoured,
    per head; no division of labour (the module docstring of :mod:`.division`).

    Example:
        >>> calls = {"mean": "not divided", "zero": "divided", "resample": "not divided"}
        >>> zero_artefact(calls, "target_class"), zero_artefact(calls, "position")
        (True, False)
        >>> zero_artefact({**calls, "resample": "divided"}, "target_class")
        False
    """
    return (
        by == "target_class"
        and calls.get("zero") == "divided"
        and calls.get("mean") == "not divided"
        and calls.get("resample", "not divided") != "divided"
    )


def zero_left_out_text(row: Mapping[str, Any]) -> str:
    """What the reason and the verdict say where :func:`zero_artefact` left zero out (zero's
    index, and its null's upper quantile where the row has it).

    Example:
        >>> zero_left_out_text({"index_zero": 0.56, "null_high_zero": 0.15})[35:72]
        "(its index 0.56 vs its null's 0.15): "
        >>> zero_left_out_text({"index_zero": 0.56})[35:53]
        '(its index 0.56): '
    """
    null = row.get("null_high_zero")
    versus = "" if null is None or math.isnan(float(null)) else f" vs its null's {float(null):.2f}"
    return (
        f"zero ablation left out of the call (its index {float(row['index_zero']):.2f}{versus}): "
        "only zero divides the target classes, and mean ablation, which differs from it only "
        "by keeping each head's mean write, does not; the split is the default-class artefact"
    )


def _null_draws(ev: Evidence, configs: Configs, basis: str, defined: Tensor, method: str) -> Tensor:
    """``[B, A]`` same-function distance under ``method``: a model on one half of the
    sequences vs a same-function model on the other (:attr:`Evidence.null_pairs`, averaged
    over them), both ablated by ``method``: function noise, sampling noise and what the
    method itself adds (resample's random donors, zero's shift of the logits) together."""
    draws = [
        same_function_distance(
            ev.kept(unit_profiles(even, configs, basis)),
            ev.kept(unit_profiles(odd, configs, basis)),
            defined,
        )
        for even, odd in ev.null_pairs.get(method, [])
    ]
    if not draws:  # no same-function model ran (one sequence: no odd half; resample on one)
        B, A = ev.means[method].shape[:2]
        return ev.means[method].new_full((B, A), math.nan, dtype=torch.float64)
    return torch.stack(draws).mean(0)


def index_rows(
    ev: Evidence, configs: Configs, gate: dict[str, Gates], basis: str, s: DivisionSettings
) -> list[dict]:
    """The rows of :attr:`~mhainterp.specialization.DivisionResult.index`, one per axis (columns in
    :mod:`~.division_result`); every axis's statistics computed at once."""
    primary = gate[s.method]
    B = s.n_bootstrap
    observed = ev.means[s.method][0]  # (A, C, K)
    first = {
        b: division_index(ev.kept(unit_profiles(observed, configs, b)), primary.units(b))
        for b in BASES
    }  # (A,) each: the observed index of every basis
    if basis:
        methods = list(ev.means)
        # Each method against its own same-function null: (M, B, A) draws, (M, A) quantiles.
        nulls = torch.stack(
            [_null_draws(ev, configs, basis, gate[m].units(basis), m) for m in methods]
        )
        null_highs = upper(nulls.transpose(0, 1), s.alpha)
        null = nulls[methods.index(s.method)]  # (B, A): the primary method's
        null_std = null[1:].std(0)
        # Every method and axis at once: (M, B, A, U, K) profiles, (M, B, A) indices.
        profiles = ev.kept(unit_profiles(torch.stack(list(ev.means.values())), configs, basis))
        units = torch.stack([gate[m].units(basis) for m in methods])[:, None, None]
        all_draws = division_index(profiles, units)
        lows, highs = interval(all_draws.transpose(0, 1), s.alpha)  # (M, A) each
        # p: the null's resamples at least the primary index (its rows 1..).
        index = all_draws[methods.index(s.method), 0]  # (A,)
        hits = (null[1:] >= index[None] - 1e-12).sum(0)  # (A,)
        # (A, A): each axis's index that each other axis's profiles give through the data
        primary_profiles = profiles[methods.index(s.method), 0]
        implied = implied_index(ev.given, primary_profiles, primary.units(basis), ev.keep)
    rows = []
    for a, axis in enumerate(ev.axes):
        row: dict = {
            "by": axis,
            "n_values": int(ev.n_values[a]),
            "n_damaging": int(primary.single.sum()),
            "n_kept": int(primary.kept.sum()),
            "n_groups": len(configs.groups),
            "basis": basis,
            "p_floor": 1.0 / (1 + B),
            "null_init_index": math.nan,
        }
        row.update({f"index_{b}": float(first[b][a]) for b in BASES})
        for m in METHODS:
            row[f"index_{m}"], row[f"call_{m}"] = math.nan, ""
            row[f"null_index_{m}"] = row[f"null_high_{m}"] = math.nan
        row.update(explained_by="", index_explained=math.nan)
        nan_stats = ("index", "ci_low", "ci_high", "null_index", "null_high", "p")
        row.update(dict.fromkeys(nan_stats, math.nan) | {"null_index_std": math.nan})
        if not basis:
            row.update(call="cannot tell", divided=False, reason=_undefined_reason(primary))
            rows.append(row)
            continue
        calls = {}
        for i, m in enumerate(ev.means):
            value, low = float(all_draws[i, 0, a]), float(lows[i, a])
            own_high = float(null_highs[i, a])
            calls[m] = _call(value, low, own_high, s.min_index)
            row[f"index_{m}"], row[f"call_{m}"] = value, calls[m]
            row[f"null_index_{m}"], row[f"null_high_{m}"] = float(nulls[i, 0, a]), own_high
            if m == s.method:
                row.update(
                    index=value,
                    ci_low=low,
                    ci_high=float(highs[i, a]),
                    null_index=float(null[0, a]),
                    null_high=own_high,
                    null_index_std=float(null_std[a]),
                    p=math.nan if math.isnan(value) else (1 + int(hits[a])) / (1 + B),
                )
        artefact = zero_artefact(calls, axis)
        call = combine_calls({m: c for m, c in calls.items() if not (artefact and m == "zero")})
        row.update(call=call, divided=call == "divided")
        row["reason"] = _reason(row, primary, basis, calls)
        if artefact:
            row["reason"] += "; " + zero_left_out_text(row)
        rows.append(row)
    if basis:  # once every axis has its call: only a division can be restated
        leaders = [r["call"] in SERVING for r in rows]
        for a, row in enumerate(rows):
            row.update(_explained(ev.axes, implied[a], leaders))
    return rows


SERVING = ("divided", "method-dependent")
"""The calls that claim (or hedge on) a division: what another axis can restate."""


def _explained(axes: list[str], implied: Float[Tensor, " A"], leaders: list[bool]) -> dict:
    """``explained_by``: among the axes called divided or method-dependent (``leaders``), the
    one whose profiles give this axis the largest index through the data alone, and that index
    (``index_explained``); "" and NaN without one. An axis that is not divided is no leader:
    a division cannot restate one that is not there."""
    masked = torch.where(torch.tensor(leaders, device=implied.device), implied, math.nan)
    if not bool((~masked.isnan()).any()):
        return {"explained_by": "", "index_explained": math.nan}
    best = int(torch.nan_to_num(masked, nan=-1.0).argmax())
    return {"explained_by": axes[best], "index_explained": float(masked[best])}


def _call(index: float, low: float, null_high: float, min_index: float) -> str:
    """Divided when the index's interval lies above its null's upper quantile (significance)
    and the index is at least ``min_index`` (an effect).

    Example:
        >>> _call(0.30, 0.25, 0.05, 0.02), _call(0.005, 0.004, 0.001, 0.02)
        ('divided', 'not divided')
    """
    if math.isnan(index) or math.isnan(null_high):
        return "cannot tell"
    beyond = low > null_high + TOLERANCE and index >= min_index - TOLERANCE
    return "divided" if beyond else "not divided"


def _undefined_reason(g: Gates) -> str:
    return (
        f"fewer than 2 heads or groups do the work: {int(g.single.sum())} damaging alone, "
        f"{int(g.group.sum())} group(s) damaging, {int(g.kept.sum())} contributing kept alone"
    )


def _reason(row: dict, g: Gates, basis: str, calls: dict[str, str]) -> str:
    stats = (
        f"{row['index']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}] vs same-function "
        f"null {row['null_index']:.2f} (upper {row['null_high']:.2f})"
    )
    if basis == "single":
        text = f"{int(g.single.sum())} heads damage alone; single-head profiles: {stats}"
    else:
        what = "kept-head profiles" if basis == "kept" else "group profiles"
        text = (
            f"cannot tell from single-head ablation ({int(g.single.sum())} damaging head(s) "
            f"alone; the others are backed up); {what}: {stats}"
        )
    if row["call"] == "method-dependent":
        text += "; methods disagree, each against its own null: " + ", ".join(
            f"{m} {row[f'index_{m}']:.2f} vs {row[f'null_high_{m}']:.2f} ({c})"
            for m, c in calls.items()
        )
    return text


@dataclass
class SelectivityTest:
    """One profile per head and axis against its nulls (:func:`selectivity_test`).

    Attributes:
        selectivity: ``[B, A, H]`` the profile's selectivity (row 0 observed).
        null_mean: ``[A, H]`` the larger of the two nulls' centres (the scope's whole job's
            selectivity; the shuffled profile's mean).
        null_high: ``[A, H]`` the larger of the two nulls' upper ``1 - alpha`` quantiles.
        gain: ``[A, H]`` the effect: ``selectivity - null_mean`` (observed).
        p: ``[A, H]`` one-sided p of "more selective than both nulls" (the larger of the two).
    """

    selectivity: Float[Tensor, "B A H"]
    null_mean: Float[Tensor, "A H"]
    null_high: Float[Tensor, "A H"]
    gain: Float[Tensor, "A H"]
    p: Float[Tensor, "A H"]


def _normal_p(difference: Tensor, sd: Tensor) -> Tensor:
    """One-sided normal tail of ``difference / sd``; with no spread, 0 for a difference
    above :data:`TOLERANCE` and 1 otherwise; NaN where the difference is NaN."""
    inf = torch.full_like(difference, math.inf)
    z = torch.where(
        sd > 0, difference / sd.clamp(min=1e-300), torch.where(difference > TOLERANCE, inf, -inf)
    )
    return torch.where(difference.isnan(), math.nan, torch.special.ndtr(-z))


def selectivity_test(
    sel: Float[Tensor, "B A H"],
    job_sel: Float[Tensor, "B A H"],
    shuffled_sel: Float[Tensor, "M A H"],
    alpha: float,
) -> SelectivityTest:
    """A profile's selectivity against the two nulls of the heads table, each a normal
    approximation without a floor (so that a correction over many heads can pass one):

    - the job null, paired on the bootstrap resamples: ``d_b = sel_b - job_b``, ``z = d_0 /
      sd(d_1..)`` (a head that does its scope's job in small is not specialized);
    - the shuffled null (the head's own damage with the values shuffled among the triples):
      ``z = (sel_0 - mean) / sqrt(var(sel_1..) + var)`` (sampling noise of a flat profile).

    ``p`` is the larger of the two (both must be beaten).

    Example:
        >>> sel = torch.tensor([0.5, 0.5, 0.5])[:, None, None]
        >>> job = torch.tensor([0.1, 0.1, 0.1])[:, None, None]
        >>> t = selectivity_test(sel, job, torch.zeros(4, 1, 1), alpha=0.05)
        >>> round(float(t.gain), 6), float(t.p)
        (0.4, 0.0)
    """
    sel, job_sel, shuffled_sel = sel.double(), job_sel.double(), shuffled_sel.double()
    paired = sel - job_sel  # (B, A, H)
    p_job = _normal_p(paired[0], paired[1:].std(0))
    spread = (sel[1:].var(0) + shuffled_sel.var(0)).sqrt()
    p_shuffled = _normal_p(sel[0] - shuffled_sel.mean(0), spread)
    null_mean = torch.fmax(job_sel[0], shuffled_sel.mean(0))
    null_high = torch.fmax(upper(job_sel, alpha), _quantile(shuffled_sel, 1 - alpha))
    return SelectivityTest(
        sel, null_mean, null_high, sel[0] - null_mean, torch.fmax(p_job, p_shuffled)
    )


def heads_rows(
    ev: Evidence,
    configs: Configs,
    g: Gates,
    scores: PassScores,
    norms: Tensor,
    s: DivisionSettings,
    generator: torch.Generator,
) -> list[dict]:
    """Columns of :attr:`~mhainterp.specialization.DivisionResult.heads`, one dict per axis; every
    axis's statistics computed at once.

    A head is **specialized** along an axis when its profile is significantly more selective
    than both nulls (``p_adj < alpha``, corrected over every head and axis), by an effect of
    at least ``min_selectivity_gain`` (``selectivity_gain``), and it spares a value (serves a
    strict subset). A head with both a single and a kept profile must pass with both: removed
    alone, a head can lose only the values its partners cannot cover by themselves (two exact
    copies of a head each lose the few values half the signal misses), which says where the
    partners fall short, not whom the head serves; kept alone, it shows what it carries.
    """
    B, K = s.n_bootstrap, ev.n_values[:, None]  # K: (A, 1)
    means = ev.means[s.method]  # (B, A, C, K)
    single = ev.kept(unit_profiles(means, configs, "single"))  # (B, A, H, K)
    kept = ev.kept(unit_profiles(means, configs, "kept"))
    use_kept = g.kept & ~g.single
    prof = torch.where(use_kept[:, None], kept, single)  # (B, A, H, K)
    defined = g.single | g.kept
    # The job null: what the head's scope (its layer, or the model for heads kept across
    # layers or working alone in their layer) does as a whole; a head that does that job in
    # small is not specialized.
    job = ev.kept(means[..., [configs.clean], :] - means[..., job_rows(configs, defined), :])
    every = torch.ones(len(configs.pairs), dtype=torch.bool, device=job.device)
    job_sel = selectivity(job, every, K)
    sel = selectivity(prof, defined, K)  # (B, A, H)
    test = selectivity_test(
        sel, job_sel, _shuffled(ev, scores, configs, use_kept, defined, B, generator), s.alpha
    )
    p, gain = test.p, test.gain
    both = g.single & g.kept
    kept_sel = torch.full_like(sel[0], math.nan)
    if bool(both.any()):  # a head with both profiles passes with both (docstring)
        everywhere = torch.ones_like(use_kept)
        own = selectivity_test(
            selectivity(kept, g.kept, K),
            job_sel,
            _shuffled(ev, scores, configs, everywhere, g.kept, B, generator),
            s.alpha,
        )
        p = torch.where(both, torch.fmax(p, own.p), p)
        gain = torch.where(both, torch.fmin(gain, own.gain), gain)
        kept_sel = torch.where(g.kept, own.selectivity[0], math.nan)
    # (A, H); the frame's rows run axis by axis, heads within
    adjusted = adjust_pvalues(p.flatten().numpy(), s.correction)
    p_adj = torch.as_tensor(adjusted, device=p.device).reshape(p.shape)
    n_eff = effective_values(prof[:1], defined)[0]  # (A, H)
    helped = helped_share(prof[0])  # (A, H): what the clipping leaves out, defined or not
    low, high = interval(sel, s.alpha)
    served = _served(prof[0], ev.keep, s)  # (A, H, K)
    # Serving a subset means sparing a value: a head whose profile serves every kept value is
    # a generalist, however far from perfectly even its damage is (L0H6 of count_previous h=8:
    # selectivity 0.012, beyond a null of 0.005 on 30k triples, serves all 10 tokens).
    spares = (served.sum(-1) < K).numpy()  # (A, H)
    specialized = specialized_rule(
        defined[None].numpy(), p_adj.numpy(), gain.numpy(), spares, s.alpha, s.min_selectivity_gain
    )
    layer_of = [p[0] for p in configs.pairs]
    group_of, damage_group = _head_groups(configs, g)
    layer_total = torch.zeros(len(configs.layer), dtype=torch.float64, device=norms.device)
    layer_total.index_add_(0, torch.tensor(layer_of, device=norms.device), norms)
    scope = np.where(g.kept.numpy(), np.where(configs.across, "model", "layer"), "")
    shared = {
        "head_label": np.array([head_label(*p) for p in configs.pairs], dtype=object),
        "layer": np.array(layer_of),
        "head": np.array([p[1] for p in configs.pairs]),
        "basis": np.where(
            g.single.numpy(), "single", np.where(use_kept.numpy(), "kept", "")
        ).astype(object),
        "kept_scope": scope.astype(object),
        "p_floor": math.nan,  # a normal approximation: no floor
        "total_damage": g.damage_alone.numpy(),
        "damage_alone": g.damage_alone.numpy(),
        "loss_increase": g.loss_increase.numpy(),
        "kept_contribution": g.kept_contribution.numpy(),
        "damage_group": damage_group,
        "group": np.array(group_of, dtype=object),
        "write_norm": norms.numpy(),
        "write_share": (norms / layer_total[layer_of].clamp(min=1e-300)).numpy(),
        "null_init_mean": math.nan,
    }
    parts = []
    for a, axis in enumerate(ev.axes):
        names = ev.value_names[axis]
        values = [
            ",".join(names[v] for v in row.nonzero()[:, 0].tolist()) if ok else ""
            for row, ok in zip(served[a], defined.tolist(), strict=True)
        ]
        parts.append(
            {
                **shared,
                "by": axis,
                "selectivity": sel[0, a].numpy(),
                "ci_low": low[a].numpy(),
                "ci_high": high[a].numpy(),
                "null_selectivity": job_sel[0, a].numpy(),
                "null_mean": test.null_mean[a].numpy(),
                "null_high": test.null_high[a].numpy(),
                "selectivity_gain": gain[a].numpy(),
                "kept_selectivity": kept_sel[a].numpy(),
                "served_share": (n_eff[a] / K[a]).numpy(),
                "n_eff": n_eff[a].numpy(),
                "helped_share": helped[a].numpy(),
                "served_values": np.array(values, dtype=object),
                "serves": np.where(specialized[a], np.array(values, dtype=object), ""),
                "specialized": specialized[a],
                "p": p[a].numpy(),
                "p_adj": p_adj[a].numpy(),
                "n_values": int(K[a]),
            }
        )
    return parts


def job_rows(configs: Configs, defined: Bool[Tensor, " H"]) -> list[int]:
    """Per head, the row its scope's job is measured against (``clean - that row``): its
    layer removed, or every head removed for a head kept across layers and for a head that
    is the only one of its layer with a defined profile. Such a head's layer job is its own
    job, so beside it any selectivity is "that job in small": two layers that split the
    positions, one working head each, would serve nothing (audit), while the index between
    them says they divide the work.

    Example:
        >>> from mhainterp.specialization.whom.profiles import build_configs
        >>> c = build_configs(2, 2)
        >>> job_rows(c, torch.tensor([True, True, True, False])), c.nothing
        ([5, 5, 15, 6], 15)
    """
    if configs.nothing is None:  # one layer, or no every-head row: the layer is the scope
        return list(configs.kept_ref)
    layers = torch.tensor([layer for layer, _ in configs.pairs], device=defined.device)
    working = torch.zeros(int(layers.max()) + 1, dtype=torch.long, device=defined.device)
    working.index_add_(0, layers, defined.long())
    alone = (defined & (working[layers] == 1)).tolist()
    return [configs.nothing if a else r for r, a in zip(configs.kept_ref, alone, strict=True)]


def specialized_rule(
    defined: np.ndarray,
    p_adj: np.ndarray,
    gain: np.ndarray,
    spares: np.ndarray,
    alpha: float,
    min_gain: float,
) -> np.ndarray:
    """The one rule of a head's **specialized** flag (arrays broadcast together): its profile
    is defined, beats both nulls after correction (``p_adj < alpha``), by an effect of at least
    ``min_gain`` (``selectivity_gain``), and it spares a value. The heads table decides with
    it, and the stability check re-decides from a saved table with it.

    Example:
        >>> specialized_rule(np.array([True, True]), np.array([0.001, 0.001]),
        ...                  np.array([0.5, 0.06]), np.array([True, True]), 0.05, 0.075)
        array([ True, False])
    """
    with np.errstate(invalid="ignore"):
        return (
            defined.astype(bool)
            & (np.asarray(p_adj, dtype=float) < alpha)
            & (np.asarray(gain, dtype=float) >= min_gain - TOLERANCE)
            & spares.astype(bool)
        )


def _served(observed: Float[Tensor, "A H K"], keep: Tensor, s: DivisionSettings) -> Tensor:
    """``[A, H, K]`` the values a profile serves: damage at least ``serve_share`` of its
    largest and at least ``min_damage``, among the kept values."""
    observed = observed.clamp(min=0)
    largest = observed.max(-1).values
    return (
        (observed >= s.serve_share * largest[..., None])
        & (observed >= s.min_damage)
        & keep[:, None]
    )


def _shuffled(
    ev: Evidence,
    scores: PassScores,
    configs: Configs,
    use_kept: Tensor,
    defined: Tensor,
    B: int,
    generator: torch.Generator,
) -> Float[Tensor, "B A H"]:
    """The shuffled null's selectivity draws: each head's per-triple profile (kept where
    ``use_kept``, else single) with the values shuffled among the triples
    (:func:`~.selectivity.normal_null_means`), every axis side by side."""
    draws = normal_null_means(_triples(scores, configs, use_kept), ev.counts, B, generator)
    sizes = [len(ev.value_names[a]) for a in ev.axes]
    side_by_side = torch.cat([draws[a] for a in ev.axes], -1)  # (B, H, K_all)
    shuffled = ev.kept(pad_axes(side_by_side, sizes).transpose(1, 2))  # (B, A, H, K)
    return selectivity(shuffled, defined, ev.n_values[:, None])


def _triples(scores: PassScores, configs: Configs, use_kept: Tensor) -> Tensor:
    """``[H, N]`` each head's profile per triple: single damage, or kept contribution."""
    c = scores.correct
    single = c[configs.clean][None] - c[configs.single]
    kept = c[configs.kept] - c[configs.kept_ref]
    return torch.where(use_kept[:, None], kept, single)


def _quantile(draws: Tensor, q: float) -> Tensor:
    return torch.nanquantile(draws.double(), q, dim=0)


def _head_groups(configs: Configs, g: Gates) -> tuple[list[str], np.ndarray]:
    """Per head: its group's label ("" outside groups) and the group's removal damage."""
    labels, damage = [], np.full(len(configs.pairs), math.nan)
    for i, pair in enumerate(configs.pairs):
        found = [j for j, group in enumerate(configs.groups) if pair in group]
        if found:
            j = found[0]
            labels.append(",".join(head_label(*p) for p in configs.groups[j]))
            damage[i] = float(g.group_damage[j])
        else:
            labels.append("")
    return labels, damage
