"""Whom do the heads serve? Damage profiles over the inputs and outputs, against a null that
keeps head function.

A head can attend to a relation and still serve every input alike, or serve only some query
tokens, positions, target classes or targets. :func:`division_of_labour` measures this second
axis of "specialize" (DESIGN.md, "The question the toolkit answers") along four **axes**:

=================  ===================================================================
``token``          the query token's id at the scored position
``position``       the query position
``target_class``   the class the model must output there
``target``         which target (multi-target models only)
=================  ===================================================================

**Passes.** One ablation-engine pass per method (:mod:`~.profiles`) scores, at every scored
(sequence, position, target) *triple*, the clean model, each head removed alone, each layer
removed whole, each head *kept* alone in its layer (the rest of the layer removed), with two or
more layers each head kept alone in the whole model and every head removed, and each
backed-up *group* removed as one unit. The primary ``method`` (default mean) runs first; then
the other ``methods`` (zero, resample), and ``n_noise`` (1) noisy copies of the model (below)
under every method, on the configurations the call's basis needs (the clean row is shared by
the methods: it ablates nothing). The methods share one
:class:`~mhainterp.ablation.replacement.CleanCache` per model (the clean activations and
prefixes); the copies are shared by the methods.

**Screen** (``screen="attribution"``, off by default; on for pretrained models in
:func:`~mhainterp.analyze.pretrained_verdict.specialize_pretrained`): every head's damage is
first estimated by attribution patching, and only the heads whose estimate reaches half the
damage gate (with the heads of any layer the estimate misses, and a seeded sample of the rest)
get their configurations run, under every method and on the noisy copies; the others keep
their estimated rows, below every gate (:mod:`~.screen`; the tables' ``evidence`` column says
which heads are "exact" and which "attribution-screened").

**Profiles** over an axis's values ``v`` (each value weighs the same whatever its count;
values with fewer than ``min_count`` triples are kept in the tables but left out of the
statistics), by **basis**:

- ``single``: ``d_hv = acc_clean(v) - acc_without_h(v)``, the accuracy lost on ``v``;
- ``kept``: ``c_hv = acc_only_h(v) - acc_without_layer(v)``, what ``h`` alone adds on ``v``
  above its layer removed whole (it sees through backup: eight heads that each do the job
  alone have zero single damage but full kept contributions). Where that is undefined but
  ``h`` kept alone in the *whole model* adds ``min_damage`` above every head removed, the
  kept profile is that one (``kept_scope`` "model"): its layer is backed up by another layer
  (removing the whole layer costs nothing), as in a two-layer model whose heads all do one
  job. A head of a serial circuit (a layer-0 head whose output a layer-1 head reads) is
  defined in its layer and keeps the layer's profile. A pretrained model (scored by its loss)
  has no kept-alone-in-the-model rows: one head kept among hundreds removed is far from
  anything the model computes, and each such row is a full forward (on SmolLM2, 16
  sentences, a quarter of the division's forwards);
- ``group``: ``d_gv = acc_clean(v) - acc_without_g(v)`` for each backed-up group ``g``
  (given as ``groups=``, else found: heads that do no damage alone but contribute kept alone,
  joined when their kept contributions per triple have cosine >= ``group_similarity``, by
  :func:`~mhainterp.specialization.needed.redundancy.similar_groups`: within a layer, or
  across layers among heads whose kept profiles are taken across layers; a serial circuit's
  heads contribute on the same triples without backing each other up, so layers are not
  otherwise joined), and the single profiles of the damaging heads outside every group.

Profiles are clipped at 0. A profile is *defined* when its total (over all triples) is at
least ``min_damage`` in accuracy and ``min_loss_increase`` in cross-entropy (an accuracy change
alone can be argmax flips at near-ties). The call rests on ``single`` when 2 or more heads are
defined alone, else on ``group`` when 2 or more group units are, else on ``kept``, else it is
"cannot tell".

**Division index** along an axis, on the basis's defined units::

    DI = 1 - mean_{g != h} cos(p_g, p_h)

0 when every unit hurts the same values in the same proportions, 1 when their values are
disjoint; values in between are a split *with overlap*.

**Same-function null.** What would a model whose heads do the same jobs score? A noisy copy
perturbs every head's ``W_Q, W_K, W_V, W_O`` with Gaussian noise of ``noise`` (10%) x the RMS
of that head's matrix, halved until the copy's accuracy stays within ``max_accuracy_change``
(0.02) (``settings["noise_used"]``). The null index is the mean over the defined units of
``1 - cos`` between the unit's profile in the original model on one half of the sequences
(the even ones) and its profile in the noisy copy on the other half (the odd ones): the
distance of two heads doing one job, measured on different inputs, so that it holds both
function noise (the weights) and sampling noise (the sequences) -- the two things that make
real heads' profiles differ without a division. The copy runs on the odd sequences only
(half an engine pass; its mean ablation takes its means there). One direction only: also
comparing the original on the odd half with the copy on the even would double the copy's
cost, and on 42 axis calls of hand-built and demo models it changed no call (the one-way
null's upper quantile is a median 15% higher: a little more conservative). With
``n_noise`` >= 2 the copies are compared with each other instead, every pair both ways round
(each copy costs one engine pass on every sequence). Every statistic is computed on
``n_bootstrap`` (200) resamples of the sequences as well (per-sequence sums, then all
resamples in one product); ``ci_low, ci_high`` is the ``1 - alpha`` interval of the index,
``null_high`` the null's upper ``1 - alpha`` quantile, and
``p = (1 + #{null_b >= index}) / (1 + B)``, whose floor ``p_floor = 1 / (1 + B)`` is reported
beside it. A split is **divided** when ``ci_low > null_high`` (significance) and the index is
at least ``min_index`` (0.02, an effect: a mean cosine of 0.98 between the profiles is no
division, however narrow its interval).

**Methods.** The index and the call are computed under each of ``methods`` on the primary
basis (``index_mean, index_zero, index_resample``), each against its **own** same-function
null: the noisy copy scored under that method (``null_index_<method>, null_high_<method>``;
``null_index, null_high`` are the primary method's). A method's ablation adds its own noise to
the profiles (resample's random donors; zero's shift of the logits), and a same-function
model ablated the same way shows it too: judged against the mean-ablation null, zero and
resample read that noise as division (on the 24 demo models at h = 4 and 8, 20 of 72 axis
calls were "method-dependent"; each method against its own null, 11 of them resolve and 4
appear). The call is the methods' common call among those where the index is defined, else
"method-dependent": the methods disagree, each against its own null (zero is left out of the
target classes' call where its split is the default-class artefact, below).

**The default-class artefact.** An ablation that removes what a head writes can leave the
model falling back on one class: zero ablation removes the head's mean write too (a bias the
readout relies on), and where nothing else writes the readout the logits tie and argmax takes
class 0; mean ablation's replacement favours a class per position. The fallback class stays
right without the head, so a target-class profile has a hole there and looks selective: the
hand-set induction circuit's layer-1 head, zero-ablated, spares exactly class 0, its layer-0
head does not, and zero ablation alone calls the target classes divided; mean and resample
ablation say not divided. Two noisy copies of a head whose mean write the readout relies on
show it too: removing either copy's half of that write leaves the other near a class's bias,
and each copy's noise decides which classes fall (zero index 0.34-0.56 against its own null's
0.10-0.15; mean 0.00). The hole is no division of labour, and it is detected: mean ablation is
zero ablation with each head's per-position mean write put back, so where zero alone calls
the target classes divided and mean calls them not divided (resample not divided either), the
split lies in the mean writes that zero removes. The call then leaves zero out
(:func:`~.division_calls.zero_artefact`; it was "method-dependent"), and the reason, the
verdict and the summary line say so; ``call_zero`` keeps zero's own call.

**Selectivity** of a head (K-invariant): with ``p_v = d_v / sum_u d_u`` over the K kept
values::

    n_eff = exp(H(p)),  H(p) = -sum_v p_v log p_v;   selectivity = 1 - n_eff / K

``n_eff`` is the number of values served, counted evenly, ``served_share = n_eff / K``, and
``selectivity`` the share of values spared: "serves 1 of 2" and "serves 4 of 8" both score 0.5,
"serves 9 of 10" scores 0.1 and "serves 1 of 10" 0.9. A head's profile is its single profile
when it is defined, else its kept profile (``basis``; NaN without either). Its null
(``null_selectivity``) is the selectivity of its scope's whole job (its layer's removal
profile; every head's, for a head kept across layers or the only head of its layer with a
defined profile, whose layer's job is its own): a head that does that job in small is not
specialized. A second null spreads the head's own damage evenly over the values with its
sampling noise (values shuffled among the triples). ``p`` is one-sided against the larger of
the two (normal approximations, no floor; ``p_adj`` over every head and axis). **Specialized**
needs significance (``p_adj < alpha``), an effect (``selectivity_gain``, the selectivity
above the null's mean, at least ``min_selectivity_gain``, 0.075), and a spared value; a head
with both a single and a kept profile must pass with both (removed alone, a copy of a head
loses only what its partner misses, which is not whom it serves). ``served_values`` follows
from the profile alone: the kept values whose damage is at least ``serve_share`` of the head's
largest and at least ``min_damage`` (a head carrying classes 2-9 serves exactly ``2,...,9``);
``serves`` is the same where the head is specialized, "" elsewhere.

**Dead by function** (for the labels): the heads table also has each head's ``write_norm``
(mean ``|z_h W_O|`` over real positions of the first ``n_attention`` sequences) and
``write_share`` (its share of its layer's), ``damage_alone`` (accuracy lost removing it alone),
``damage_group`` (removing its group, NaN outside groups), ``group`` and
``kept_contribution`` (accuracy it adds kept alone).

**Attention-side view** (:attr:`DivisionResult.attention`): per head, query token (and
position) and relation template, the share of attention on the template
(:mod:`~.division_attention`). It describes; the profiles decide.

Shapes: H heads, N scored triples, K values of an axis, B = 1 + n_bootstrap resamples (row 0
observed), U units of a basis, C configurations.

Example:
    >>> from mhainterp.model.handbuilt import split_heads_model
    >>> from mhainterp.tasks import split_batch
    >>> model = split_heads_model([("target", [0, 1, 2, 3]), ("target", [4, 5, 6, 7, 8])])
    >>> result = division_of_labour(model, split_batch(256), method="zero", n_bootstrap=50)
    >>> result.heads.query("by == 'target_class'")["serves"].tolist()
    ['0,1,2,3', '4,5,6,7,8']
    >>> result.index.set_index("by").loc["target_class", ["call", "basis"]].tolist()
    ['divided', 'single']
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from mhainterp.ablation.replacement import METHODS, CleanCache
from mhainterp.data import Data, as_batch, batch_for_model, target_names
from mhainterp.heads import head_label, resolve_heads
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import scored_by_loss
from mhainterp.runtime import uses_work_threads
from mhainterp.scoring import CleanOutputMetric
from mhainterp.specialization.needed.redundancy import similar_groups
from mhainterp.specialization.settings import (
    DivisionSettings,
    SpecializationSettings,
    resolve_settings,
)
from mhainterp.specialization.whom.damage import TripleDamage, axis_values
from mhainterp.specialization.whom.division_attention import attention_view
from mhainterp.specialization.whom.division_calls import (
    Evidence,
    Gates,
    choose_basis,
    gates,
    heads_rows,
    index_rows,
)
from mhainterp.specialization.whom.division_result import (
    BASIS_PROFILE_COLUMNS,
    HEADS_COLUMNS,
    PROFILE_COLUMNS,
    DivisionResult,
    index_columns,
    join_columns,
)
from mhainterp.specialization.whom.pass_store import PassStore
from mhainterp.specialization.whom.profiles import (
    Configs,
    PassScores,
    ValueMeans,
    basis_rows,
    bootstrap_weights,
    build_configs,
    damage_metric,
    noisy_copy,
    pad_axes,
    run_pass,
    run_rows,
    value_given,
    write_norms,
)
from mhainterp.specialization.whom.screen import Screen, estimate_damage, screen_heads
from mhainterp.tasks import AXES, Batch, Task
from mhainterp.tasks.text import TEXT_AXES
from mhainterp.validation import check_option, invalid

__all__ = [
    "division_of_labour",
    "division_request",
]


def _normalise_by(by: Sequence[str] | str, known: Sequence[str] = AXES) -> list[str]:
    """``by`` as a list of ``known`` axes without repeats (``"token,position"`` is split)."""
    parts = [p.strip() for p in by.split(",") if p.strip()] if isinstance(by, str) else list(by)
    axes: list[str] = []
    for axis in parts:
        check_option("by", axis, tuple(known))
        if axis not in axes:
            axes.append(axis)
    if not axes:
        raise invalid("by", by, f"one or more of {', '.join(known)}")
    return axes


def _task_axes(data: Any, by: Sequence[str] | str) -> tuple[Any, list[str], list[str]]:
    """A task's own axes (a text task's token class, position bucket and target frequency:
    ``data.axes(batch) -> (ids per [n, T] position, value names)``), the axes ``by`` names
    (the task's own by default: ``by`` left at :data:`~mhainterp.tasks.AXES`), and every axis
    that may be asked. A task's axis replaces the generic one of the same name."""
    axes_of = getattr(data, "axes", None) if isinstance(data, Task) else None
    if not callable(axes_of):
        return None, _normalise_by(by), list(AXES)
    own = list(getattr(data, "axis_names", None) or TEXT_AXES)
    known = list(dict.fromkeys([*own, *AXES]))
    asked = (
        own if not isinstance(by, str) and tuple(by) == tuple(AXES) else _normalise_by(by, known)
    )
    return axes_of, asked, known


def division_request(
    settings: DivisionSettings | SpecializationSettings | None = None,
    by: Sequence[str] | str = AXES,
    **given: Any,
) -> dict:
    """What a saved result must have been made with to be reused: the resolved settings and
    the axes asked for (compared with the saved ``settings``).

    Example:
        >>> division_request(by="token")["by_asked"]
        ['token']
    """
    return {**resolve_settings(settings, **given).to_dict(), "by_asked": _normalise_by(by)}


def _axes_that_apply(
    by: Sequence[str] | str, counts: dict[str, torch.Tensor], n_targets: int, min_count: int
) -> tuple[list[str], dict[str, str]]:
    """The asked axes that apply, and why each other one is skipped."""
    kept, skipped = [], {}
    known = list(dict.fromkeys([*([] if isinstance(by, str) else by), *AXES]))
    for axis in _normalise_by(by, known):
        if axis == "target" and n_targets < 2:
            skipped[axis] = "a single-target model"
        elif int((counts[axis] >= min_count).sum()) < 2:
            skipped[axis] = f"fewer than 2 values with >= {min_count} scored triples"
        else:
            kept.append(axis)
    return kept, skipped


# ----------------------------------------------------------------------------- entry point


@uses_work_threads
def division_of_labour(
    model: HookedMHATransformer,
    data: Data,
    by: Sequence[str] | str = AXES,
    *,
    settings: DivisionSettings | SpecializationSettings | None = None,
    groups: Sequence[str | Sequence[Any]] | None = None,
    relations: Any = None,
    progress: bool = False,
    passes: PassStore | None = None,
    **changes: Any,
) -> DivisionResult:
    """Whom each head serves along each axis, and whether the heads divide the work, against
    the same-function null, under every ablation method.

    Args:
        model: The model.
        data: A Task (its evaluation set of ``n_eval``), or a Batch (tokens raise: scoring
            needs targets).
        by: Axes (a list or ``"token,position"``); those that do not apply are skipped
            (``target`` on a single-target model, an axis with fewer than 2 values that have
            ``min_count`` triples).
        settings: A :class:`DivisionSettings`, or a
            :class:`~mhainterp.specialization.SpecializationSettings` (its
            :attr:`~mhainterp.specialization.SpecializationSettings.division`: the shared
            ``n_eval, alpha, correction, min_damage, seed, method``); default the defaults.
        groups: Backed-up groups to remove as one unit (head sets, ``"L0H0,L0H1"`` or lists);
            default: found from the kept-head profiles (module docstring).
        relations: Templates of the attention-side view: a Task, a dict of ``[n, T, T]``
            templates aligned with the batch, or ``f(tokens, mask) -> dict``; default the Task
            when ``data`` is one.
        progress: Progress bars.
        passes: The :class:`~.pass_store.PassStore` of an earlier division of the same model
            and data (its result's ``passes``): every engine row it holds is reused, and only
            the head sets this call adds are run (a moved gate: seconds, not the passes
            again). Default: a new store, returned as the result's ``passes``.
        **changes: :class:`DivisionSettings` fields to change (``method="zero"``,
            ``n_bootstrap=100``, ...); None values are ignored.

    Returns:
        A :class:`DivisionResult` (columns in its module).

    Example:
        >>> result = division_of_labour(run.model, run.task)  # doctest: +SKIP
        >>> print(result.summary_line())  # doctest: +SKIP
    """
    s = resolve_settings(settings, **changes)
    axes_of, by, _ = _task_axes(data, by)
    data_batch = as_batch(data, n_eval=s.n_eval, needs_targets=True)
    batch = batch_for_model(model, data_batch)
    if passes is not None and not isinstance(passes, PassStore):
        raise invalid("passes", type(passes).__name__, "None or a division's result.passes")
    store = PassStore() if passes is None else passes
    # None: cross-entropy and accuracy (toy models)
    metric = store.memo(("metric",), lambda: damage_metric(model, batch))
    names = target_names(data, model.cfg.n_targets)
    L, h = model.cfg.n_layers, model.cfg.n_heads
    # With 2+ layers also every head kept alone in the model; not on a pretrained model
    # (scored by its loss), where the kept profile is the head alone in its layer
    across = not scored_by_loss(model)
    configs = build_configs(L, h, across_layers=across)
    relations = data if relations is None and isinstance(data, Task) else relations
    # The methods share the clean activations of this model and batch; the clean run also
    # keeps the attention view's patterns.
    rows_kept = s.n_attention if relations is not None else 0
    cache = store.cache(model, batch, lambda: CleanCache(pattern_rows=rows_kept))
    screen = None
    if s.screen == "attribution":  # exact profiles only for the heads that matter (.screen)
        primary, engine, screen = _screened_pass(
            model, batch, configs, s, cache, metric, progress, store
        )
    else:
        primary, engine = run_pass(
            model,
            batch,
            configs.head_sets,
            s.method,
            progress=progress,
            cache=cache,
            metric=metric,
            store=store,
        )
    # The engine ran on the model's device; the statistics run on the CPU, where the passes'
    # per-triple scores are (run_pass), so the axes' values come along.
    scored = engine.scores.scored
    values, value_names = axis_values(engine.batch, scored, list(names))
    values = {a: v.cpu() for a, v in values.items()}
    own_axes: list[str] = []
    if axes_of is not None:  # the task's own axes, at the scored triples (row-major)
        ids, own_names = axes_of(data_batch)
        i, t, _ = scored.cpu().nonzero(as_tuple=True)
        for axis, per_position in ids.items():
            values[axis] = per_position.cpu()[i, t].clamp(min=0)
            value_names[axis] = list(own_names[axis])
            own_axes.append(axis)
    sequence = scored.nonzero()[:, 0].cpu()
    counts = {a: torch.bincount(v, minlength=len(value_names[a])) for a, v in values.items()}
    axes, skipped = _axes_that_apply(by, counts, model.cfg.n_targets, s.min_count)
    configs = _kept_scope(primary, configs, s)
    given = None if groups is None else [resolve_heads(model, g) for g in groups]
    found = _groups(primary, configs, s) if given is None else given
    if found:
        configs = build_configs(L, h, found, across_layers=across).kept_across(configs.across)
        group_sets = [configs.head_sets[i] for i in configs.group]
        more, _ = run_pass(
            model, batch, group_sets, s.method, cache=cache, metric=metric, store=store
        )
        primary = PassScores(
            s.method, torch.cat([primary.correct, more.correct]), torch.cat([primary.nll, more.nll])
        )
    basis = choose_basis(gates(primary, configs, s))
    # The other methods and the noisy copies run only what the call's basis needs.
    rows = basis_rows(configs, basis)
    # the screened-out heads' rows are not run: they come from their estimates
    run = rows if screen is None else screen.exact_rows(rows)
    passes = {s.method: primary}
    for method in tqdm(s.methods[1:] if basis else (), desc="methods", disable=not progress):
        if not _can_run(method, len(batch)):
            continue  # its call is "cannot tell"
        passes[method] = run_rows(model, batch, configs, run, method, cache, primary, metric, store)
        if screen is not None:
            screen.fill(passes[method])
    noisy, noise_used = (
        _noisy_passes(model, batch, configs, run, primary, sequence, s, progress, metric, store)
        if basis
        else ({}, 0.0)
    )
    if screen is not None:  # a copy's screened heads: the original's estimates
        on = _noisy_triples(len(batch), sequence, s)
        for copies in noisy.values():
            for copy_pass in copies:
                screen.fill(copy_pass, on)
    gate = {m: gates(p, configs, s) for m, p in passes.items()}
    weights = bootstrap_weights(len(batch), s.n_bootstrap, torch.Generator().manual_seed(s.seed))
    null_generator = torch.Generator().manual_seed(s.seed + 2)
    # The mean and resample passes captured every layer's clean z of the batch: reuse it.
    norms = write_norms(model, batch[: s.n_attention], cache.donor_z).cpu()
    index, heads_parts, profile_parts, basis_parts = [], [], [], []
    if axes:
        ev = _evidence(axes, passes, noisy, rows, sequence, values, value_names, counts, weights, s)
        index = index_rows(ev, configs, gate, basis, s)
        heads_parts = heads_rows(ev, configs, gate[s.method], primary, norms, s, null_generator)
        profile_parts = [_profile_part(ev, a, configs, s) for a in range(len(axes))]
        basis_parts = [_basis_part(ev, a, configs, gate[s.method], s) for a in range(len(axes))]
    td = _triple_damage(primary, configs, values, value_names, scored)
    generic = [a for a in axes if a not in own_axes]  # the view groups by raw ids only
    attention = attention_view(
        model, batch[: s.n_attention], relations, generic, td, cache.patterns
    )
    meta = {
        **s.to_dict(),
        "by_asked": list(by),
        **({"damage": _damage_name(model)} if scored_by_loss(model) else {}),
        "by": list(axes),
        "basis": basis,
        "noise_used": noise_used,
        "groups": [_label(g) for g in configs.groups],
        "groups_given": given is not None,
    }
    heads = _frame(heads_parts, HEADS_COLUMNS)  # p_adj: corrected over every head and axis
    profiles = _frame(profile_parts, PROFILE_COLUMNS)
    if screen is not None:  # which basis each head's numbers rest on
        exact_total = primary.loss[configs.single] - primary.loss[configs.clean]
        meta["screen_summary"] = screen.summary(configs.pairs, exact_total)
        evidence = dict(zip(map(_label, [[p] for p in configs.pairs]), screen.evidence()))
        heads["evidence"] = heads["head_label"].map(evidence)
        profiles["evidence"] = profiles["head_label"].map(evidence)
    return DivisionResult(
        heads=heads,
        index=pd.DataFrame(index, columns=index_columns()),
        profiles=profiles,
        attention=attention,
        basis_profiles=_frame(basis_parts, BASIS_PROFILE_COLUMNS),
        settings=meta,
        skipped=skipped,
        single_damage=td if screen is not None else None,  # the specialization test's input
        passes=store,
    )


def _evidence(
    axes: list[str],
    passes: dict[str, PassScores],
    noisy: dict[str, list[PassScores]],
    rows: list[int],
    sequence: torch.Tensor,
    values: dict[str, torch.Tensor],
    value_names: dict[str, list[str]],
    counts: dict[str, torch.Tensor],
    weights: torch.Tensor,
    s: DivisionSettings,
) -> Evidence:
    """Every axis's per-value accuracies: every method's pass on the resamples ``weights``
    ``[B, n]``, and each method's null passes (the original and one noisy copy, or the
    copies, under that method) on the even and the odd sequences of each resample, on the
    basis's ``rows`` only (NaN elsewhere); every axis and pass side by side, so that each
    weight table is one product (per half, with one copy: the original's even half is then
    the first of the two)."""
    B = weights.shape[0]
    even = _even_sequences(weights.shape[1], weights.device)  # the null's split halves
    sizes = {a: len(value_names[a]) for a in axes}
    tables = ValueMeans(sequence, {a: values[a] for a in axes}, sizes, weights, halves=even)
    primary = passes[s.method]
    first_half = None
    if any(len(ps) == 1 for ps in noisy.values()):  # one copy, on the odd sequences' triples
        by_method, evens = tables.of_passes_and_first_half(list(passes.values()))
        first_half = (dict(zip(passes, evens, strict=True)), ~even[sequence])
    else:
        by_method = tables.of_passes(list(passes.values()))
    loss = tables.observed(primary.nll)  # (A, C, K)
    K = list(sizes.values())
    padded_counts = pad_axes(torch.cat([counts[a] for a in axes]), K)  # (A, K_max)
    ones = torch.ones(sum(K), device=padded_counts.device)
    inside = pad_axes(ones, K) > 0  # (A, K_max): an axis's own values
    keep = inside & (padded_counts >= s.min_count)
    return Evidence(
        axes=list(axes),
        value_names={a: value_names[a] for a in axes},
        counts={a: counts[a] for a in axes},
        keep=keep,
        means=dict(zip(passes, by_method, strict=True)),
        null_pairs=_null_tables(tables, noisy, rows, B, first_half),
        loss=loss,
        given=value_given([values[a] for a in axes], K, keep),
    )


def _null_tables(
    tables: ValueMeans,
    noisy: dict[str, list[PassScores]],
    rows: list[int],
    B: int,
    first_half: tuple[dict[str, torch.Tensor], torch.Tensor] | None,
) -> dict[str, list[tuple]]:
    """Per method, its same-function comparisons (:func:`_null_pairs`) as per-value tables.
    With one copy only the halves compared are computed: the original (its basis ``rows``)
    on the even sequences, from ``first_half`` (per method, the original's tables on the
    first half; and the triples the copy ran on), the copy on the odd ones (one product for
    every method); with two or more copies, every copy on both halves."""
    if first_half is not None:
        evens, on = first_half
        odd = tables.of_passes([ps[0] for ps in noisy.values()], half=1, triples=on)
        # each model's (even, odd) halves, only the compared one computed
        return {
            m: _null_pairs([(_only_rows(evens[m], rows), None), (None, o)], with_original=True)
            for m, o in zip(noisy, odd, strict=True)
        }
    split = iter(tables.of_passes([p for ps in noisy.values() for p in ps], split=True))
    return {m: _null_pairs([next(split).split(B) for _ in ps], False) for m, ps in noisy.items()}


def _only_rows(table: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``table`` ``[B, A, C, K]`` with the configurations outside ``rows`` NaN."""
    out = torch.full_like(table, math.nan)
    out[:, :, rows] = table[:, :, rows]
    return out


def _even_sequences(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` the null's first half of the sequences (the even ones)."""
    return torch.arange(n, device=device) % 2 == 0


def _null_pairs(halves: list, with_original: bool) -> list[tuple]:
    """The same-function comparisons of :attr:`Evidence.null_pairs`, from each model's
    (even, odd) halves: with one copy (``with_original``: the original first), the original on
    the even sequences vs the copy on the odd ones, where alone the copy ran; with two or more
    copies, which ran on every sequence, every pair both ways round."""
    if with_original:
        (original_even, _), (_, copy_odd) = halves
        return [(original_even, copy_odd)]
    return [
        pair
        for i, j in itertools.combinations(range(len(halves)), 2)
        for pair in ((halves[i][0], halves[j][1]), (halves[j][0], halves[i][1]))
    ]


def _label(group: Sequence[tuple[int, int]]) -> str:
    return ",".join(head_label(layer, head) for layer, head in group)


def _frame(parts: list[dict], columns: list[str]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(columns=columns)
    present = [c for c in columns if c in parts[0]]
    return pd.DataFrame(join_columns(parts, present), columns=columns)


def _kept_scope(primary: PassScores, configs: Configs, s: DivisionSettings) -> Configs:
    """``configs`` with each head's kept profile taken across layers where it is defined only
    there: kept alone in its layer the head adds nothing (another layer backs its whole layer
    up), kept alone in the model it does (:meth:`~.profiles.Configs.kept_across`). A head of a
    serial circuit (a layer-0 head whose output a layer-1 head reads) is defined in its layer,
    so it keeps its layer's profile."""
    if not configs.kept_model:  # one layer: the layer is the model
        return configs
    in_layer = gates(primary, configs, s).kept
    in_model = gates(primary, configs.kept_across([True] * len(configs.pairs)), s).kept
    return configs.kept_across((~in_layer & in_model).tolist())


def _groups(primary: PassScores, configs: Configs, s: DivisionSettings) -> list[list]:
    """Backed-up groups: heads defined kept alone but not alone, whose kept contributions per
    triple are similar (cosine >= ``group_similarity``) within a layer, or across layers
    among the heads whose kept profiles are taken across layers (their layers back each other
    up). Heads of different layers are otherwise never grouped: a serial circuit's heads
    contribute on the same triples without backing each other up."""
    g = gates(primary, configs, s)
    candidates = (g.kept & ~g.single).tolist()
    if sum(candidates) < 2:  # a group needs two of them
        return []
    labels = [head_label(*p) for p in configs.pairs]
    contrib = (primary.correct[configs.kept] - primary.correct[configs.kept_ref]).double()
    unit = contrib / contrib.norm(dim=1, keepdim=True).clamp(min=1e-12)  # (H, N)
    cos = (unit @ unit.T).numpy()
    layers = np.array([p[0] for p in configs.pairs])
    across = np.array(configs.across)
    same_scope = (layers[:, None] == layers[None, :]) | (across[:, None] & across[None, :])
    sim = pd.DataFrame(np.where(same_scope, cos, 0.0), index=labels, columns=labels)
    out_of_play = [lab for lab, c in zip(labels, candidates, strict=True) if not c]
    found = similar_groups(sim, s.group_similarity, dead=out_of_play, min_size=2)
    return [[configs.pairs[labels.index(x)] for x in group] for group in found]


def _damage_name(model: Any) -> str:
    """What a profile's damage is on a model scored by its loss (the saved settings say it)."""
    if getattr(model.cfg, "objective", "next_token") == "embedding":
        return "embedding metric (1 - cos of each position's output to the clean one)"
    return "cross-entropy increase (nats)"


def _noisy_passes(
    model: HookedMHATransformer,
    batch: Batch,
    configs: Configs,
    rows: list[int],
    primary: PassScores,
    sequence: torch.Tensor,
    s: DivisionSettings,
    progress: bool,
    metric: CleanOutputMetric | None = None,
    store: PassStore | None = None,
) -> tuple[dict[str, list[PassScores]], float]:
    """Per method, the noisy copies' passes (``rows`` only), with the noise that keeps the
    accuracy: on all ``N`` triples (``sequence``: each one's sequence), or, with one copy, on
    the odd sequences' triples alone (``~_even_sequences(n)[sequence]``).

    The same copies serve every method (each method's null is the same-function heads scored
    under that method); a copy's clean activations are shared by its methods, and its clean
    row is run once. The noise is chosen on the clean row alone (every method shares it), so
    a copy whose accuracy moves too far costs its clean forward only; every method then runs
    the other rows once, at the noise kept.
    One copy is compared with the original on the other half of the sequences only
    (:func:`_null_pairs`), so it runs on the odd sequences alone, and its accuracy is checked
    against the original's there; two or more run on every sequence. A ``store`` keeps the
    copies (and their rows) for a later division of the same model and data.
    """
    odd = ~_even_sequences(len(batch), sequence.device)  # on the statistics' device (CPU)
    alone = s.n_noise == 1
    every = torch.ones(len(sequence), dtype=torch.bool, device=sequence.device)
    on = odd[sequence] if alone else every  # (N,)
    run_on = batch[odd.nonzero()[:, 0].to(batch.device)] if alone else batch
    if metric is not None and alone:  # the copy's damage against the original's clean output
        kept = odd.nonzero()[:, 0].to(metric.clean.device)
        metric = CleanOutputMetric(metric.kind, metric.clean[kept], metric.padding_mask[kept])
    if not bool(on.any()):  # one sequence: no odd half to run on, so the null is undefined
        return {m: [] for m in s.methods}, s.noise
    clean_accuracy = float(primary.correct[configs.clean][on].mean())
    clean = [configs.clean]

    def checked_copies() -> tuple[list, list[CleanCache], list[PassScores], float]:
        generator = torch.Generator().manual_seed(s.seed + 1)
        copies: list = [None] * s.n_noise  # a refused copy's model is reused, not copied again
        for attempt in range(5):  # the copies' own clean rows check the accuracy
            noise = s.noise / 2**attempt
            copies = [noisy_copy(model, noise, generator, twin) for twin in copies]
            # Each copy's clean run, shared by its methods; every layer's clean prefix kept
            # from it, so the rows run after the check need no clean forward of their own.
            caches = [CleanCache(every_layer=True) for _ in copies]
            bar = tqdm(copies, desc="noisy copies", disable=not progress, leave=False)
            # not through the store: a refused copy's object is reused with other weights
            cleans = [
                run_rows(c, run_on, configs, clean, s.method, k, metric=metric)
                for c, k in zip(bar, caches)
            ]
            accuracy = [float(p.accuracy[configs.clean]) for p in cleans]
            if all(abs(a - clean_accuracy) <= s.max_accuracy_change for a in accuracy):
                break
        return copies, caches, cleans, noise

    # the copies depend on these settings only (and the model and sequences of the store)
    key = ("noisy copies", s.noise, s.n_noise, s.seed, s.max_accuracy_change, s.method)
    copies, caches, cleans, noise = (
        checked_copies() if store is None else store.memo(key, checked_copies)
    )
    by_method = {
        method: [
            run_rows(c, run_on, configs, rows, method, k, p, metric, store)
            for c, k, p in zip(copies, caches, cleans, strict=True)
        ]
        for method in s.methods
        if _can_run(method, len(run_on))  # else that method's null is undefined
    }
    return by_method, noise


def _screened_pass(
    model: HookedMHATransformer,
    batch: Batch,
    configs: Configs,
    s: DivisionSettings,
    cache: CleanCache,
    metric: CleanOutputMetric | None,
    progress: bool,
    store: PassStore | None = None,
) -> tuple[PassScores, Any, Screen]:
    """The primary pass under the attribution screen (:mod:`.screen`): the clean model, each
    layer removed and every head removed, exactly; every head's damage estimated; then the
    configurations of the heads the screen keeps, exactly; the others filled from their
    estimates. Returns the pass laid out over every configuration, the engine's result of
    the first part (its scored mask and batch) and the screen."""
    bar = tqdm(total=3, desc="division (screened)", disable=not progress, leave=False)
    first_rows = [configs.clean, *configs.layer] + (
        [configs.nothing] if configs.nothing is not None else []
    )
    sets = [configs.head_sets[r] for r in first_rows]
    part, engine = run_pass(model, batch, sets, s.method, cache=cache, metric=metric, store=store)
    bar.update()
    C, N = len(configs.head_sets), part.correct.shape[1]
    correct = torch.full((C, N), math.nan, device=part.correct.device)  # the statistics'
    nll = torch.full((C, N), math.nan, device=part.correct.device)
    correct[first_rows], nll[first_rows] = part.correct, part.nll
    primary = PassScores(s.method, correct, nll)
    runnable = tuple(m for m in s.methods if _can_run(m, len(batch)))
    scored = engine.scores.scored

    def estimated() -> dict[str, Any]:
        return estimate_damage(model, batch, runnable, scored, s.seed)

    key = ("estimates", runnable, s.seed)
    estimates = estimated() if store is None else store.memo(key, estimated)
    bar.update()

    def run_exactly(rows: list[int]) -> torch.Tensor:  # the primary method's mean losses
        sets = [configs.head_sets[r] for r in rows]
        scores, _ = run_pass(
            model, batch, sets, s.method, progress=progress, cache=cache, metric=metric, store=store
        )
        return scores.loss

    screen = screen_heads(model, batch, configs, primary, estimates, s, check=run_exactly)
    rows = screen.head_rows(screen.exact)
    if rows:
        sets = [configs.head_sets[r] for r in rows]
        more, _ = run_pass(
            model,
            batch,
            sets,
            s.method,
            progress=progress,
            cache=cache,
            metric=metric,
            store=store,
        )
        correct[rows], nll[rows] = more.correct, more.nll
    bar.update()
    bar.close()
    return screen.fill(primary), engine, screen


def _noisy_triples(n: int, sequence: torch.Tensor, s: DivisionSettings) -> torch.Tensor:
    """``[N]`` the triples the noisy copies run on (:func:`_noisy_passes`): with one copy the
    odd sequences' triples, else all."""
    if s.n_noise == 1:
        return (~_even_sequences(n, sequence.device))[sequence]
    return torch.ones(len(sequence), dtype=torch.bool, device=sequence.device)


def _can_run(method: str, n_sequences: int) -> bool:
    """Whether ``method`` can ablate on ``n_sequences`` (resample, say, takes each sequence's
    replacement from another one, so it needs two: one sequence is refused by
    :func:`~mhainterp.ablation.replacement.build_replacement`)."""
    fewest = METHODS[method].min_sequences
    return fewest <= 1 or n_sequences >= fewest


def _triple_damage(
    primary: PassScores, configs: Configs, values: dict, value_names: dict, scored: torch.Tensor
) -> TripleDamage:
    """The primary pass's single-head damage as a :class:`TripleDamage` (the attention view's
    input, and the home of the per-triple tables other tests read)."""
    clean, single = primary.correct[configs.clean], primary.correct[configs.single]
    return TripleDamage(
        pairs=configs.pairs,
        damage=clean[None] - single,
        loss_increase=primary.nll[configs.single] - primary.nll[configs.clean][None],
        clean=clean,
        values=values,
        value_names=value_names,
        index=scored.nonzero().cpu(),
    )


def _profile_part(ev: Evidence, a: int, configs: Configs, s: DivisionSettings) -> dict:
    """The single-basis head x value table of axis ``a`` under the primary method (observed)."""
    m = ev.observed(s.method, a)  # (C, K)
    K = m.shape[-1]
    clean, single = m[configs.clean], m[configs.single]  # (K,), (H, K)
    loss = ev.loss[a, :, :K]
    loss_profile = loss[configs.single] - loss[configs.clean][None]
    H = single.shape[0]
    axis = ev.axes[a]
    counts, keep = ev.counts[axis], ev.keep[a, :K]
    labels = np.array([head_label(*p) for p in configs.pairs], dtype=object)
    return {
        "head_label": np.repeat(labels, K),
        "layer": np.repeat([p[0] for p in configs.pairs], K),
        "head": np.repeat([p[1] for p in configs.pairs], K),
        "by": axis,
        "value": np.tile(np.array(ev.value_names[axis], dtype=object), H),
        "n_scored": np.tile(counts.numpy().astype(int), H),
        "clean_accuracy": np.tile(clean.numpy(), H),
        "ablated_accuracy": single.numpy().ravel(),
        "damage": (clean[None] - single).numpy().ravel(),
        "loss_increase": loss_profile.numpy().ravel(),
        "in_index": np.tile(keep.numpy(), H),
    }


def _basis_part(ev: Evidence, a: int, configs: Configs, g: Gates, s: DivisionSettings) -> dict:
    """Kept-alone contributions per head and group damages per group of axis ``a``
    (observed)."""
    m = ev.observed(s.method, a)
    kept = m[configs.kept] - m[configs.kept_ref]  # (H, K)
    group = m[configs.clean][None] - m[configs.group]  # (G, K)
    units = [head_label(*p) for p in configs.pairs] + [_label(x) for x in configs.groups]
    basis = ["kept"] * len(configs.pairs) + ["group"] * len(configs.groups)
    defined = g.kept.tolist() + g.group.tolist()
    rows = torch.cat([kept, group])
    U, K = rows.shape
    axis = ev.axes[a]
    return {
        "unit": np.repeat(np.array(units, dtype=object), K),
        "by": axis,
        "basis": np.repeat(np.array(basis, dtype=object), K),
        "value": np.tile(np.array(ev.value_names[axis], dtype=object), U),
        "n_scored": np.tile(ev.counts[axis].numpy().astype(int), U),
        "profile": rows.numpy().ravel(),
        "defined": np.repeat(np.array(defined, dtype=bool), K),
        "in_index": np.tile(ev.keep[a, :K].numpy(), U),
    }
