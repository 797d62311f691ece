"""The attribution screen of the division test: exact profiles only for the heads that matter.

A pretrained model has hundreds of heads, and the division's engine pass runs two configurations
per head (removed alone, kept alone in its layer; a toy model of two or more layers also kept
alone in the model) under every ablation method and on the noisy copies. Most heads do no
measurable damage. With
``DivisionSettings(screen="attribution")`` every head is first **screened** by attribution
patching (:func:`~mhainterp.attribution.attribution_per_position`: one forward and backward of
the clean model per chunk of sequences, or ``n_probes`` backwards for an embedding model), which
estimates each head's damage at every scored triple under every method. Then:

- a head is computed **exactly** (every configuration of it, under every method and on the
  noisy copies) when any of its estimates reaches the **threshold** ``screen_margin`` x
  ``min_loss_increase`` (0.5 x 0.01 = 0.005 with the defaults): the loss increase of removing
  it alone, or the loss it holds off kept alone in its layer or in the model (means over the
  scored triples, the quantities the ``min_loss_increase`` gates read). A screened-out head's
  estimates are all below half the gate. The kept estimates are calibrated on the exact rows
  of the first pass (:func:`_calibrated`: scaled down where removing the whole layer, or every
  head, costs less than estimated; never up);
- so is every head of a layer whose exact removal costs more than :data:`LAYER_SLACK` x what
  the estimates account for (the layer's own estimate, or its heads' positive estimates
  added up, whichever is larger) plus the threshold: there the estimate misses something
  (heads that back each other up beyond the estimate's order, a saturating write), and only
  exact profiles see it;
- so is every head with an estimate that reaches the threshold **downwards** where that
  configuration, run exactly under the primary method (one row per such estimate), changes
  the loss by the threshold or more upwards: a first-order estimate that far from zero cannot
  vouch for its sign (on SmolLM2, L1H0's removal was estimated at -0.099 nats and costs
  +0.013, above the gate). The checked rows are in ``settings["screen_summary"]
  ["negative_check"]``; a checked head that stays screened is filled from its estimates like
  the others;
- so is a seeded random ``screen_sample`` share of the other heads (at least one), to check
  the screen: their exact single-removal totals against their estimates are in
  ``settings["screen_summary"]["sample_check"]``;
- every other head is **attribution-screened**: its rows are filled from its estimates
  (removed alone: the clean row plus the estimate; kept alone: the reference row minus the
  estimated contribution), below every gate by construction, so it never enters an index.
  A copy of the model in the same-function null reuses the original's estimates.

The heads and profiles tables say per head which basis its numbers rest on (``evidence``:
"exact" or "attribution-screened"), and ``settings["screen_summary"]`` records the threshold,
the counts and why each exact head is exact.

Shapes: H heads, N scored triples, n sequences, T positions, C configurations, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mhainterp.ablation.replacement import METHODS, CleanCache, build_replacement
from mhainterp.attribution import attribution_per_position
from mhainterp.heads import all_heads, head_label
from mhainterp.protocol import HookedModel, scored_by_loss
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.whom.damage import TripleDamage, triple_damage
from mhainterp.specialization.whom.profiles import Configs, PassScores
from mhainterp.tasks import Batch
from mhainterp.validation import invalid

__all__ = [
    "EXACT",
    "SCREENED",
    "SCREEN_RULE",
    "Screen",
    "estimate_damage",
    "screen_heads",
    "screened_triple_damage",
]

LAYER_SLACK = 2.0
"""A layer's exact removal may cost up to this many times its estimate (plus the threshold)
before its heads are all computed exactly: the estimate is first order (second for an
embedding model), and removing a whole layer is a large change."""
SCREEN_RULE = 2
"""The version of the rule that picks the exact heads (2: large negative estimates are
checked); part of a cached verdict's key, so a verdict saved under another rule is rerun."""
EXACT = "exact"
SCREENED = "attribution-screened"


@dataclass
class Screen:
    """Which heads the division computes exactly, and the estimates of the others.

    Attributes:
        exact: ``[H]`` computed exactly.
        why: Per head, why it is exact (``"estimate"``, ``"layer"``, ``"check"``,
            ``"sample"``) or "".
        estimates: Method -> ``[3, H, N]`` estimated loss change per scored triple of removing
            each head alone (the increase), keeping it alone in its layer and in the model
            (the decrease: its contribution).
        threshold: The estimate (mean loss increase) below which a head is screened out.
        by_loss: Whether the model is scored by its loss (``correct`` is then ``-nll``).
        single, kept, kept_ref, kept_model, nothing: The configurations' rows
            (:func:`~mhainterp.specialization.whom.profiles.build_configs` layout).
        checked: Per head whose estimates reached the threshold downwards, ``[unit, estimate,
            exact]`` for each such unit (0 removed alone, 1 kept alone in its layer, 2 in the
            model), run exactly under the primary method.
    """

    exact: Bool[Tensor, " H"]
    why: list[str]
    estimates: dict[str, Float[Tensor, "3 H N"]]
    threshold: float
    by_loss: bool
    single: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    kept_ref: list[int] = field(default_factory=list)
    kept_model: list[int] = field(default_factory=list)
    nothing: int | None = None
    checked: dict[int, list[list[float]]] = field(default_factory=dict)

    @property
    def estimated(self) -> Float[Tensor, " H"]:
        """Each head's estimated mean loss increase removed alone (the primary method's)."""
        return next(iter(self.estimates.values()))[0].mean(1)

    def head_rows(self, heads: Bool[Tensor, " H"]) -> list[int]:
        """The configurations of ``heads``: removed alone, kept alone in the layer and in the
        model."""
        out = []
        for h in heads.nonzero()[:, 0].tolist():
            out += [self.single[h], self.kept[h]]
            out += [self.kept_model[h]] if self.kept_model else []
        return sorted(out)

    def exact_rows(self, rows: list[int]) -> list[int]:
        """``rows`` without the screened-out heads' configurations."""
        screened = set(self.head_rows(~self.exact))
        return [r for r in rows if r not in screened]

    def fill(self, scores: PassScores, triples: Bool[Tensor, " N"] | None = None) -> PassScores:
        """``scores`` with the screened-out heads' rows set from the estimates (where the
        row they are read from was run), in place; ``triples``: the triples the pass ran on,
        when not all (a noisy copy on the odd sequences)."""
        estimate = self.estimates.get(scores.method, next(iter(self.estimates.values())))
        estimate = (estimate if triples is None else estimate[..., triples]).float()
        nll, correct = scores.nll, scores.correct
        ran = None if scores.rows is None else set(scores.rows)
        filled = []
        for h in (~self.exact).nonzero()[:, 0].tolist():
            single, kept, kept_model = estimate[:, h]
            pairs = [(self.single[h], 0, single), (self.kept[h], self.kept_ref[h], -kept)]
            if self.kept_model and self.nothing is not None:
                pairs.append((self.kept_model[h], self.nothing, -kept_model))
            for row, ref, change in pairs:
                if ran is not None and ref not in ran:
                    continue  # the row it is read from was not run: it stays NaN
                nll[row] = nll[ref] + change
                # the accuracy has no first-order estimate: a toy model's stays the reference's
                correct[row] = -nll[row] if self.by_loss else correct[ref]
                filled.append(row)
        if ran is not None:
            scores.rows = sorted(ran | set(filled))
        return scores

    def evidence(self) -> list[str]:
        """Per head, :data:`EXACT` or :data:`SCREENED`."""
        return [EXACT if e else SCREENED for e in self.exact.tolist()]

    def summary(self, pairs: list[tuple[int, int]], exact_total: Tensor | None) -> dict:
        """What ``settings["screen_summary"]`` records: the threshold, the counts, why each
        exact head is exact, and the sampled heads' exact totals against their estimates."""
        labels = [head_label(*p) for p in pairs]
        est = self.estimated
        out: dict = {
            "threshold": self.threshold,
            "n_exact": int(self.exact.sum()),
            "n_screened": int((~self.exact).sum()),
            "exact_because": {lab: w for lab, w in zip(labels, self.why, strict=True) if w},
        }
        if self.checked:  # the large negative estimates run exactly: [unit, estimate, exact]
            out["negative_check"] = {labels[h]: units for h, units in self.checked.items()}
        if exact_total is not None:
            out["sample_check"] = {
                lab: [float(est[i]), float(exact_total[i])]
                for i, (lab, w) in enumerate(zip(labels, self.why, strict=True))
                if w == "sample"
            }
        return out


def estimate_damage(
    model: HookedModel,
    batch: Batch,
    methods: tuple[str, ...],
    scored: Bool[Tensor, "n T k"],
    seed: int = 0,
) -> dict[str, Float[Tensor, "H N"]]:
    """Per method, every head's estimated loss increase at every scored triple (row-major,
    as the engine's), kept alone in its layer and in the model, then every layer's removed
    whole (``[3H + L, N]``, :data:`~mhainterp.attribution.ESTIMATE_UNITS`):
    :func:`~mhainterp.attribution.attribution_per_position` at the triple's position, shared
    evenly over the position's scored targets."""
    cache = CleanCache()
    replacements = {
        m: build_replacement(model, m, batch, torch.Generator().manual_seed(seed), cache=cache)
        for m in methods
        if len(batch) >= METHODS[m].min_sequences
    }
    per_position = attribution_per_position(
        model,
        batch,
        replacements,
        units="all",
        generator=torch.Generator().manual_seed(seed + 3),
    )
    scored = scored.cpu()
    i, t, _ = scored.nonzero(as_tuple=True)
    targets = scored.sum(-1).to(torch.float64)[i, t]  # (N,) scored targets at the position
    return {m: (e[:, i, t] / targets).float() for m, e in per_position.items()}


def screen_heads(
    model: HookedModel,
    batch: Batch,
    configs: Configs,
    first: PassScores,
    estimates: dict[str, Float[Tensor, "U N"]],
    s: DivisionSettings,
    check: Callable[[list[int]], Float[Tensor, " R"]] | None = None,
) -> Screen:
    """Which heads to compute exactly (module docstring), from the ``estimates``
    (:func:`estimate_damage`) and the ``first`` pass (its clean, layer and every-head rows
    exact; the kept estimates are calibrated on them, :func:`_calibrated`). ``check`` runs
    configuration rows exactly under the primary method and returns their mean losses: the
    large negative estimates are checked with it (:func:`_check_large_negatives`); None
    checks none."""
    H, L = len(configs.pairs), len(configs.layer)
    threshold = s.screen_margin * s.min_loss_increase
    ordered = {s.method: estimates.get(s.method, next(iter(estimates.values()))), **estimates}
    loss = first.nll.double().mean(1)
    layer_of = torch.tensor([p[0] for p in configs.pairs])
    units = {m: _calibrated(e, loss, configs, layer_of) for m, e in ordered.items()}  # (3, H, N)
    primary = units[s.method].double().mean(-1)  # (3, H): single, kept, kept in the model
    if len(configs.layer) > 1 and not configs.kept_model:  # none run (a pretrained model)
        primary = primary[:2]
    # What the estimates account for of each layer's removal: the layer's own estimate, or
    # its heads' damaging estimates added up, whichever is larger (a first-order sum with
    # signs lets heads whose estimates are slightly negative cancel the others: on SmolLM2
    # that flagged 21 of 30 layers, 185 heads, where the damaging heads alone account for
    # the exact removal within 2x in all but one)
    layer_own = ordered[s.method][3 * H : 3 * H + L].double().mean(1)  # (L,)
    layers = torch.tensor([p[0] for p in configs.pairs])
    damaging = torch.zeros(L, dtype=torch.float64).index_add_(0, layers, primary[0].clamp(min=0))
    layer_estimate = torch.maximum(layer_own, damaging)
    # a head matters when removing it alone, or keeping it alone (in its layer or in the
    # model), reaches the threshold: a screened-out head is below every gate
    matters = primary.amax(0) >= threshold
    why = ["estimate" if bool(m) else "" for m in matters]
    for layer, row in enumerate(configs.layer):
        exact_layer = float(loss[row] - loss[configs.clean])
        missed = exact_layer - LAYER_SLACK * float(layer_estimate[layer])
        if missed >= threshold:  # the estimate misses this layer's work
            for h in (layers == layer).nonzero()[:, 0].tolist():
                why[h] = why[h] or "layer"
    checked = _check_large_negatives(primary, why, threshold, configs, loss, check)
    rest = [h for h in range(H) if not why[h]]
    if rest and s.screen_sample > 0:
        n_sample = max(1, math.ceil(s.screen_sample * len(rest)))
        order = torch.randperm(len(rest), generator=torch.Generator().manual_seed(s.seed + 4))
        for k in order[:n_sample].tolist():
            why[rest[k]] = "sample"
    return Screen(
        exact=torch.tensor([bool(w) for w in why]),
        why=why,
        estimates=units,
        threshold=threshold,
        by_loss=scored_by_loss(model),
        single=list(configs.single),
        kept=list(configs.kept),
        kept_ref=list(configs.kept_ref),
        kept_model=list(configs.kept_model),
        nothing=configs.nothing,
        checked=checked,
    )


def _check_large_negatives(
    primary: Float[Tensor, "U H"],
    why: list[str],
    threshold: float,
    configs: Configs,
    loss: Float[Tensor, " C"],
    check: Callable[[list[int]], Float[Tensor, " R"]] | None,
) -> dict[int, list[list[float]]]:
    """Run exactly each estimate of a screened-out head that reaches the threshold
    *downwards*, and make the head exact (``why`` "check", in place) where the exact change
    reaches it upwards: a first-order estimate that far from zero cannot vouch for its sign
    (SmolLM2's L1H0: estimated -0.099 nats, exact +0.013, above the gate). Returns, per
    checked head, ``[unit, estimate, exact]`` for each unit run (0 removed alone, 1 kept
    alone in its layer, 2 kept alone in the model)."""
    if check is None:
        return {}
    # only the units whose configuration is run: no kept-alone-in-the-model rows without
    # ``kept_model`` (a one-layer or a pretrained model)
    units = 3 if configs.kept_model and configs.nothing is not None else 2
    doubtful = [
        (h, u)
        for h in range(primary.shape[1])
        if not why[h]
        for u in range(min(units, primary.shape[0]))
        if float(primary[u, h]) <= -threshold
    ]
    if not doubtful:
        return {}

    # each unit's configuration, the row its change is read against (both as screen.fill
    # pairs them) and the change's sign: removed alone costs, kept alone holds off
    def unit(h: int, u: int) -> tuple[int, int, float]:
        if u == 0:
            return configs.single[h], configs.clean, 1.0
        if u == 1:
            return configs.kept[h], configs.kept_ref[h], -1.0
        return configs.kept_model[h], configs.nothing, -1.0  # type: ignore[return-value]

    runs = sorted({unit(h, u)[0] for h, u in doubtful})
    exact_loss = dict(zip(runs, check(runs).double().tolist(), strict=True))
    checked: dict[int, list[list[float]]] = {}
    for h, u in doubtful:
        row, ref, sign = unit(h, u)
        exact = sign * (exact_loss[row] - float(loss[ref]))  # the ref rows ran in the first pass
        checked.setdefault(h, []).append([u, float(primary[u, h]), exact])
        if exact >= threshold:
            why[h] = "check"
    return checked


def _calibrated(
    estimate: Float[Tensor, "U N"], loss: Float[Tensor, " C"], configs: Configs, layers: Tensor
) -> Float[Tensor, "3 H N"]:
    """The head units of ``estimate`` (``[3H + L + 1, N]``, :func:`estimate_damage`), the kept
    contributions scaled to the exact removals they are measured against: a whole layer, or
    every head, removed is a large change, where a damage that saturates (an embedding's
    ``1 - cos`` is at most 2) falls short of its second-order estimate. Each kept
    contribution in a layer is scaled by ``min(1, exact / estimated)`` of removing that layer
    (of removing every head, kept alone in the model); never scaled up, so the screen stays
    on the safe side."""
    H, L = len(configs.pairs), len(configs.layer)
    heads = estimate[: 3 * H].reshape(3, H, -1).clone()
    clean = loss[configs.clean]
    est_layer = estimate[3 * H : 3 * H + L].double().mean(1)  # (L,)
    exact_layer = loss[configs.layer] - clean
    ratio = (exact_layer / est_layer.clamp(min=1e-12)).clamp(min=0, max=1)
    heads[1] *= ratio[layers].to(heads.dtype)[:, None]
    if configs.nothing is not None:
        est_every = float(estimate[3 * H + L].double().mean())
        exact_every = float(loss[configs.nothing] - clean)
        heads[2] *= min(1.0, max(0.0, exact_every / max(est_every, 1e-12)))
    return heads


def screened_triple_damage(
    model: HookedModel,
    batch: Batch,
    *,
    method: str,
    exact: Collection[str],
    names: Sequence[str] = (),
    seed: int = 0,
    progress: bool = False,
) -> TripleDamage:
    """:func:`~mhainterp.specialization.whom.damage.triple_damage` where only the ``exact``
    heads are removed by the engine; every other head's row is its attribution estimate of
    removing it alone (:func:`estimate_damage`, not calibrated: the single removal never is).

    The specialization test of a pretrained model takes ``exact`` from the division's screen
    (the heads whose ``evidence`` is :data:`EXACT`), so its single-head damage rests on the
    same basis as the division's profiles: the other heads' estimates are below half the
    damage gate. Only for a model scored by its loss, where the damage is the loss increase
    that the estimate gives (a toy model's accuracy drop has no estimate).

    Example:
        >>> td = screened_triple_damage(model, batch, method="mean",
        ...                             exact={"L1H0"})  # doctest: +SKIP
    """
    if not scored_by_loss(model):
        raise invalid("model", type(model).__name__, "a model scored by its loss (pretrained)")
    every = list(all_heads(model.cfg.n_layers, model.cfg.n_heads))
    run = [pair for pair in every if head_label(*pair) in set(exact)]
    part = triple_damage(model, batch, method=method, names=names, progress=progress, pairs=run)
    # On the host, as every per-triple table here: triple_damage returns its rows there, and
    # estimate_damage reads the mask there (attribution fills host tables, as the division's).
    scored = torch.zeros(len(batch), batch.tokens.shape[1], batch.n_targets, dtype=torch.bool)
    scored[tuple(part.index.T)] = True  # the engine's scored triples, row-major as its rows
    estimate = estimate_damage(model, batch, (method,), scored, seed)[method]  # (3H + L + 1, N)
    damage = estimate[: len(every)].clone()  # removed alone: the first H units
    damage[[every.index(pair) for pair in run]] = part.damage
    return TripleDamage(
        pairs=every,
        damage=damage,
        loss_increase=damage.clone(),  # scored by its loss: the damage is the loss increase
        clean=part.clean,
        values=part.values,
        value_names=part.value_names,
        index=part.index,
    )
