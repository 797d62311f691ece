"""Role scores: the share of each head's attention that lands on each relation template, with
the permutation null.

A *role* is a relation template (:mod:`mhainterp.tasks.templates`): the task's own relations
(``task.relations``) plus the generic ones of :data:`GENERIC_ROLES`. A head's **role score** is
TransformerLens's ``detect_head`` "mul" score, the share of attention on the template,

    score = mean over counted queries of  sum_k pattern[q, k] * template[q, k],

where a query counts when it is a real token, sees at least two keys (a query that sees one key
has no choice to make) and at least one of its template keys is visible (so a causal head is not
blamed for missing a key it may not see; row 0 of ``previous`` never counts). The sums are
capture's :class:`~mhainterp.capture.TemplateMass`, the accumulator behind
``capture.head_statistics``' ``relation_mass``, given these queries and the template restricted
to the visible keys.

``uniform`` is scored differently: its template is every visible key, so the share would be 1 for
every head. Its score is instead the overlap of the head's distribution with the uniform one,
``sum_k min(pattern[q, k], 1 / n_visible)`` (1 = uniform, ``1 / n_visible`` = one-hot), which is
also its ``evenness``. It is a descriptive score, never a role: shuffling keys does not change it
(no permutation null), and without a sink a head spread evenly over every key averages what it
reads rather than counting anything.

**Counting over every key** (``uniform+sink``, :data:`EVERY_KEY`). When the first position is a
sink, a BOS whose token no later position of its sequence holds, uniform attention over every
key counts them: the BOS's share ``1 / (n + 1)`` encodes ``n``. That is tracr's SelectorWidth of
an always-true selector (its ``length`` program: uniform over the BOS and every token). On such
data the role ``uniform+sink`` (every visible key, the sink among them) is scored like
``uniform``, by its overlap, and tested against the initialisation null alone
(:data:`INIT_ONLY_ROLES`, :mod:`.nulls`): untrained heads are near-uniform (overlap 0.75-0.78,
spread 0.02, in the demo's models), so a head beyond them counts over every key (label
``count:uniform+sink``).

**Counting** (a head that attends uniformly over a selected set, usually with a sink). Two
scores describe it, and a head counts when both hold (:mod:`.labels`):

- *template mass* on the set, or on the set plus a **sink**: for every role ``X`` whose template
  marks two or more visible keys on some query, the role ``X+sink`` marks ``X``'s keys and the
  first position (the BOS-like resting key a counting head parks the rest of its attention
  on: with ``c`` keys in the set and a sink, uniform attention puts ``1 / (c + 1)`` on the sink,
  which encodes the count). ``X+sink`` is an ordinary role with the permutation null below;
- *evenness*: on the queries whose set ``X`` has at least two visible keys, the overlap of the
  head's distribution *within* the set (its weights on ``X``'s keys divided by their sum) with
  the uniform distribution over those keys, ``sum_{k in X} min(p_k / m_X, 1 / |X|)``, averaged
  over those queries: 1 = spread exactly evenly over the set, ``1 / |X|`` = all on one of its
  keys; NaN when no query has two keys in the set (a one-key relation cannot be counted over).
  ``X+sink`` has the evenness of ``X`` (the sink may take any share). The column
  ``evenness`` of the role table.

**Explained share.** The role ``explained`` (descriptive, never a label) is the mass on the
union of every testable role's template: how much of a head's attention the known roles
account for; ``1 - explained`` is what none of them describes, and its ``chance`` is the
share of visible keys the union marks (what a head blind to every role gets).

**Permutation null** (the head ignores the template). Within each counted query the head's
weights are shuffled over the keys the mask lets it see, independently per query; the score
under this null is a mean of independent per-query masses, each the sum of the weights that land
on ``s`` of the ``n`` visible keys. Its exact mean and variance per query are those of sampling
``s`` of ``n`` weights without replacement:

    E = s / n,    Var = s (n - s) / (n - 1) * sigma^2,    sigma^2 = mean_k (w_k - 1/n)^2,

so the null of the score has mean ``chance = mean(s / n)`` and variance ``sum(Var) / N^2`` over
the ``N`` counted queries (thousands on a few hundred sequences), and the p-value is the normal
tail of ``z = (score - chance) / sd``. :func:`permutation_null_samples` draws the same null by
Monte Carlo (vectorised); the tests check that both agree.

Effect size: ``effect = (score - chance) / (1 - chance)``, the share of the attention that could
be above chance that is: 0 = what a head blind to the template gets, 1 = all attention on it.

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from scipy import stats
from torch import Tensor

from mhainterp.capture import (
    TemplateMass,
    iter_activations,
    pattern_hook_names,
    statistic_queries,
    visible_keys,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.heads import head_label
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import head_matrix
from mhainterp.runtime import DRAW_DEVICE, model_device
from mhainterp.tasks import (
    Task,
    first_position_template,
    mirror_template,
    previous_token_template,
    same_token_template,
    self_template,
    uniform_template,
)

__all__ = [
    "COUNT_PREFIX",
    "DESCRIPTIVE_ROLES",
    "EVERY_KEY",
    "GENERIC_ROLES",
    "INIT_ONLY_ROLES",
    "OVERLAP_ROLES",
    "SINK",
    "ROLE_COLUMNS",
    "RoleSums",
    "base_relation",
    "capture_role_sums",
    "generic_templates",
    "has_sink",
    "nested_roles",
    "permutation_null_samples",
    "role_frame",
    "role_scores",
    "role_templates",
]

GENERIC_ROLES = ("previous", "self", "first_position", "same_token", "mirror", "uniform")
"""Generic relation templates scored for every task (after the task's own relations)."""

DESCRIPTIVE_ROLES = ("uniform", "explained")
"""Roles reported as scores but never tested or used as labels (see the module docstring)."""

EVERY_KEY = "uniform+sink"
"""The role of every visible key on data whose first position is a sink (a BOS): a head
spread evenly over it counts the keys (the module docstring)."""

INIT_ONLY_ROLES = (EVERY_KEY,)
"""Roles scored by their overlap with uniform attention, which no key shuffle changes: tested
against the initialisation null alone (:func:`~.nulls.combine_nulls`)."""

OVERLAP_ROLES = ("uniform", *INIT_ONLY_ROLES)
"""Roles whose template is every visible key, scored by the overlap with uniform attention."""


SINK = "+sink"
"""Suffix of a role that adds the sink (first position) to a set's template."""

COUNT_PREFIX = "count:"
"""Prefix of the label of a head that counts over a set (``count:same_token_upto+sink``)."""


def base_relation(role: str) -> str:
    """The relation a role or label is built on: ``count:`` and ``+sink`` stripped.

    Example:
        >>> base_relation("count:same_token_upto+sink")
        'same_token_upto'
    """
    role = role.removeprefix(COUNT_PREFIX)
    return role.removesuffix(SINK)


ROLE_COLUMNS = [
    "head_label",
    "layer",
    "head",
    "role",
    "task_relation",
    "score",
    "chance",
    "effect",
    "evenness",
    "perm_std",
    "z_perm",
    "p_perm",
    "n_queries",
]
"""Columns of :func:`role_scores` (see :func:`role_frame`)."""


# ----------------------------------------------------------------------------- templates


def generic_templates(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> dict[str, Float[Tensor, "n q k"]]:
    """The generic role templates of :data:`GENERIC_ROLES` for ``tokens``.

    ``same_token`` marks the *other* positions holding the query's token (the query itself is
    ``self``); in a causal model only the earlier ones are visible, so it becomes "earlier copies".

    Example:
        >>> t = generic_templates(torch.tensor([[3, 1, 3]]))
        >>> t["same_token"][0].tolist()
        [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """
    own = self_template(tokens, padding_mask)
    return {
        "previous": previous_token_template(tokens, padding_mask),
        "self": own,
        "first_position": first_position_template(tokens, padding_mask),
        "same_token": same_token_template(tokens, padding_mask) * (1.0 - own),
        "mirror": mirror_template(tokens, padding_mask),
        "uniform": uniform_template(tokens, padding_mask),
    }


def role_templates(
    tokens: Tensor,
    padding_mask: Tensor | None = None,
    *,
    task: Task | None = None,
    causal: bool = False,
) -> dict[str, Float[Tensor, "n q k"]]:
    """The task's relation templates, then the generic ones, without duplicates.

    A generic template is dropped when a role of the same name is already there (the task's
    wins) or when, restricted to the keys a query may see, it equals one already there (e.g. the
    generic ``same_token`` and a task's ``same_token_before`` in a causal model). Then every
    role whose template marks two or more visible keys on some query gets its ``+sink``
    variant (the set plus the first position; dropped the same way when it duplicates one),
    and last comes ``explained``, the union of every testable template (module docstring).

    Args:
        tokens: ``[n, pos]`` token ids.
        padding_mask: ``[n, pos]`` bool, True for real tokens (None: all real).
        task: Adds ``task.relations(tokens, padding_mask)`` first.
        causal: Whether the model is causal (decides which keys are visible for the
            duplicate check).

    Returns:
        Role name -> float32 ``[n, q, k]`` 0/1 template, task relations first.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("count_previous", seq_len=4, d_vocab=3)
        >>> list(role_templates(torch.tensor([[0, 1, 0, 0]]), task=task, causal=True))[:4]
        ['same_token_upto', 'previous', 'self', 'first_position']
        >>> list(role_templates(torch.tensor([[0, 1, 0, 0]]), task=task, causal=True))[4:]
        ['same_token', 'mirror', 'uniform', 'same_token_upto+sink', 'same_token+sink', 'explained']
    """
    mask = torch.ones_like(tokens, dtype=torch.bool) if padding_mask is None else padding_mask
    visible = visible_keys(mask, causal).float()
    out: dict[str, Tensor] = {}
    if task is not None:
        out.update({k: v.float() for k, v in task.relations(tokens, mask).items()})
    for name, template in generic_templates(tokens, mask).items():
        if name in out:
            continue
        if any(torch.equal(template * visible, other * visible) for other in out.values()):
            continue
        out[name] = template
    first = first_position_template(tokens, mask)
    for name, template in list(out.items()):
        if name in DESCRIPTIVE_ROLES or not bool(((template * visible).sum(-1) >= 2).any()):
            continue
        sink = torch.maximum(template, first)
        if any(torch.equal(sink * visible, other * visible) for other in out.values()):
            continue
        out[name + SINK] = sink
    if has_sink(tokens, mask):  # uniform over every key then counts them (module docstring)
        out[EVERY_KEY] = uniform_template(tokens, mask)
    # explained: the union of the relations' templates (every key would explain everything)
    testable = [t for name, t in out.items() if name not in (*DESCRIPTIVE_ROLES, EVERY_KEY)]
    if testable:
        out["explained"] = torch.stack(testable).amax(0)
    return out


def has_sink(tokens: Tensor, padding_mask: Tensor | None = None) -> bool:
    """Whether the first position of every sequence is a sink: a real token that no later real
    position of its sequence holds (a BOS).

    Example:
        >>> has_sink(torch.tensor([[9, 1, 2], [9, 2, 2]])), has_sink(torch.tensor([[1, 1, 2]]))
        (True, False)
    """
    mask = torch.ones_like(tokens, dtype=torch.bool) if padding_mask is None else padding_mask
    again = (tokens[:, 1:] == tokens[:, :1]) & mask[:, 1:]
    return bool(mask[:, 0].all()) and not bool(again.any())


def nested_roles(
    templates: Mapping[str, Tensor], visible: Bool[Tensor, "n T T"]
) -> set[tuple[str, str]]:
    """``(inner, outer)`` pairs of testable roles whose visible template keys nest on the
    queries both roles count (a query counts for a role when it sees two or more keys and one
    of the role's keys): there, every key ``inner`` marks, ``outer`` marks too (e.g.
    ``same_token_before`` inside the bidirectional ``same_token``, ``self`` inside
    ``same_token_upto``). Used to tell a head that mixes two relations from one whose relation
    sits inside another. Queries only one of the two counts do not decide it: a role scored
    on other queries than its partner was never compared with it there.

    Example:
        >>> tokens = torch.tensor([[1, 2, 1, 1]])
        >>> t = role_templates(tokens, task=None)
        >>> t["before"] = same_token_template(tokens, strictly_before=True)
        >>> nested = nested_roles(t, torch.ones(1, 4, 4, dtype=torch.bool))
        >>> ("before", "same_token") in nested, ("same_token", "before") in nested
        (True, False)
    """
    vis = visible.bool()
    queries = statistic_queries(vis)  # (n, T)
    marked = {
        name: template.bool() & vis
        for name, template in templates.items()
        if name not in DESCRIPTIVE_ROLES
    }
    counted = {name: a.any(-1) & queries for name, a in marked.items()}  # (n, T)
    out = set()
    for inner, a in marked.items():
        for outer, b in marked.items():
            both = counted[inner] & counted[outer]
            if inner == outer or not bool(both.any()):
                continue
            if not bool((a & ~b & both[..., None]).any()):
                out.add((inner, outer))
    return out


# ----------------------------------------------------------------------------- sums


@dataclass
class RoleSums:
    """Running sums, per role, that give the role scores and their permutation null.

    Attributes:
        mass: The share of attention on each role's template, over the counted queries
            (capture's :class:`~mhainterp.capture.TemplateMass`; for ``uniform``, the overlap
            with the uniform distribution).
        evenness: Per role, the overlap of the within-set distribution with uniform over the
            set, on queries with two or more visible set keys (module docstring).
        perm_var_sum: Per role, float64 ``[L, h]``: sum over counted queries of the
            permutation variance of the mass.
        chance_sum: Per role: sum over counted queries of ``s / n`` (the null mean of the mass).
        output_sq: Per head: sum over real positions of ``|hook_result|^2`` (its residual write).
        resid_sq: Per layer ``[L]``: sum over real positions of ``|hook_resid_pre|^2``.
        n_positions: Real positions summed over.
    """

    mass: TemplateMass = field(default_factory=TemplateMass)
    evenness: TemplateMass = field(default_factory=TemplateMass)
    perm_var_sum: dict[str, Tensor] = field(default_factory=dict)
    chance_sum: dict[str, float] = field(default_factory=dict)
    output_sq: Tensor | None = None
    resid_sq: Tensor | None = None
    n_positions: float = 0.0

    def _add_null(self, role: str, var: Tensor, chance: float) -> None:
        self.perm_var_sum[role] = self.perm_var_sum.get(role, 0.0) + var
        self.chance_sum[role] = self.chance_sum.get(role, 0.0) + chance

    def add_batch(
        self,
        patterns: Float[Tensor, "B L h T T"],
        templates: Mapping[str, Tensor],
        visible: Bool[Tensor, "B T T"],
    ) -> None:
        """Add one batch's masses and permutation moments for every role."""
        p = patterns.double()
        vis = visible.double()  # (B, T, T)
        n_vis = vis.sum(-1)  # (B, T)
        queries = statistic_queries(visible)  # (B, T): real, >= 2 visible keys
        safe_n = n_vis.clamp(min=1)
        # sigma^2 of each query's weights over its visible keys: sum(w^2)/n - 1/n^2.
        sigma2 = (p.square().sum(-1) / safe_n[:, None, None] - safe_n[:, None, None] ** -2).clamp(
            min=0
        )  # (B, L, h, T)
        for role, template in templates.items():
            if role in OVERLAP_ROLES:
                self._add_uniform(role, p, vis, n_vis, queries)
                continue
            on = template.to(p.device).double() * vis  # (B, T, T): reachable template keys
            rows = self.mass.add_template(role, p, on, queries)  # and >= 1 reachable key
            s = on.sum(-1)  # (B, T)
            if role in DESCRIPTIVE_ROLES:  # explained: a mass and its chance, no test
                zeros = torch.zeros(p.shape[1:3], dtype=torch.float64, device=p.device)
                self._add_null(role, zeros, float((s / safe_n * rows.double()).sum()))
                continue
            base = role.removesuffix(SINK)
            base_on = on if base == role or base not in templates else None
            if base_on is None:
                base_on = templates[base].to(p.device).double() * vis
            self._add_evenness(role, p, base_on, queries)
            keep = rows.double()
            var = s * (n_vis - s) / (n_vis - 1).clamp(min=1)  # (B, T), x sigma^2 below
            self._add_null(
                role,
                (sigma2 * (var * keep)[:, None, None]).sum((0, 3)),
                float((s / safe_n * keep).sum()),
            )

    def _add_evenness(self, role: str, p: Tensor, on: Tensor, queries: Tensor) -> None:
        """Overlap of each head's within-set distribution with uniform over the set."""
        size = on.sum(-1)  # (B, T)
        rows = queries & (size >= 2)
        within = p * on[:, None, None]  # (B, L, h, T, T)
        m = within.sum(-1, keepdim=True)  # (B, L, h, T, 1)
        share = within / m.clamp(min=1e-300)
        uniform = (on / size.clamp(min=1)[..., None])[:, None, None]
        overlap = torch.minimum(share, uniform).sum(-1)  # (B, L, h, T)
        overlap = torch.where(m[..., 0] > 0, overlap, torch.zeros_like(overlap))
        self.evenness.add_values(role, overlap, rows)

    def _add_uniform(
        self, role: str, p: Tensor, vis: Tensor, n_vis: Tensor, queries: Tensor
    ) -> None:
        share = (1.0 / n_vis.clamp(min=1))[:, None, None, :, None] * vis[:, None, None]
        overlap = torch.minimum(p, share).sum(-1)  # (B, L, h, T)
        self.mass.add_values(role, overlap, queries)
        if role in INIT_ONLY_ROLES:  # a counting set: every visible key, so the within-set
            self.evenness.add_values(role, overlap, queries)  # distribution is the head's own
        zeros = torch.zeros(p.shape[1:3], dtype=torch.float64, device=p.device)
        self._add_null(role, zeros, math.nan)

    def add_outputs(
        self,
        results: Float[Tensor, "B T L h d"],
        resid: Float[Tensor, "B T L d"],
        padding_mask: Bool[Tensor, "B T"],
    ) -> None:
        """Add one batch's squared norms of each head's write and of the residual stream."""
        real = padding_mask.double()[:, :, None, None]
        out_sq = (results.double().square().sum(-1) * real).sum((0, 1))  # (L, h)
        res_sq = (resid.double().square().sum(-1) * real[..., 0]).sum((0, 1))  # (L,)
        self.output_sq = out_sq if self.output_sq is None else self.output_sq + out_sq
        self.resid_sq = res_sq if self.resid_sq is None else self.resid_sq + res_sq
        self.n_positions += float(padding_mask.sum())

    def output_ratio(self) -> Float[Tensor, "L h"]:
        """RMS of each head's write over the RMS of its layer's input residual stream."""
        if self.output_sq is None or self.resid_sq is None:
            raise ValueError("no outputs were captured (use capture_role_sums(..., outputs=True))")
        return (self.output_sq / self.resid_sq.clamp(min=1e-300)[:, None]).sqrt()


def capture_role_sums(
    model: HookedMHATransformer,
    tokens: Tensor,
    padding_mask: Tensor,
    templates: Mapping[str, Tensor],
    *,
    outputs: bool = True,
    batch_size: int = 512,
) -> RoleSums:
    """Run ``model`` on ``tokens`` batch by batch and accumulate :class:`RoleSums`.

    One forward pass per batch (capture's streaming loop,
    :func:`~mhainterp.capture.iter_activations`) keeps the attention patterns and, with
    ``outputs``, each head's residual write (``hook_result``) and the layer input
    (``hook_resid_pre``).

    Args:
        model: The model.
        tokens: ``[n, T]`` token ids.
        padding_mask: ``[n, T]`` bool, True for real tokens.
        templates: Role name -> ``[n, T, T]`` template aligned with ``tokens``.
        outputs: Also accumulate output norms (for the "dead" test).
        batch_size: Sequences per forward pass.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> tokens = torch.randint(0, 10, (8, 16))
        >>> sums = capture_role_sums(handbuilt_model(["dead"], d_head=48), tokens,
        ...                          torch.ones_like(tokens, dtype=torch.bool),
        ...                          role_templates(tokens))
        >>> float(sums.output_ratio()[0, 0])
        0.0
    """
    L = model.cfg.n_layers
    pattern_names = pattern_hook_names(model)
    z_names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]  # results: z @ W_O
    resid_names = [f"blocks.{layer}.hook_resid_pre" for layer in range(L)]
    names = pattern_names + (z_names + resid_names if outputs else [])
    sums = RoleSums()
    device = model_device(model)
    for part in iter_activations([model], tokens, [names], padding_mask, batch_size=batch_size):
        acts, mask = part.activations[0], part.padding_mask.to(device)
        patterns = torch.stack([acts[n] for n in pattern_names], dim=1)
        patterns = patterns * mask[:, None, None, :, None]  # padding query rows are meaningless
        stop = part.start + part.tokens.shape[0]
        part_templates = {k: v[part.start : stop] for k, v in templates.items()}
        sums.add_batch(patterns, part_templates, visible_keys(mask, model.cfg.causal))
        if outputs:
            with torch.no_grad():  # each head's write, z_h @ W_O[h]
                results = torch.stack(  # through the protocol: a bridge has no .blocks
                    [
                        torch.einsum("bthd,hdm->bthm", acts[n], head_matrix(model, layer, "W_O"))
                        for layer, n in enumerate(z_names)
                    ],
                    2,
                )
            resid = torch.stack([acts[n] for n in resid_names], 2)
            sums.add_outputs(results, resid, mask)
    return sums


# ----------------------------------------------------------------------------- tables


def role_frame(sums: RoleSums, task_relations: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """The role-score table of accumulated :class:`RoleSums`.

    Returns:
        One row per (head, role), heads layer-major, roles in template order, columns
        :data:`ROLE_COLUMNS`: ``score`` (share of attention on the template; overlap with
        uniform for ``uniform``), ``chance`` (the permutation-null mean), ``effect``
        (``(score - chance) / (1 - chance)``), ``evenness`` (spread within the set, NaN for
        one-key relations and descriptive roles), ``perm_std`` (the null's standard deviation),
        ``z_perm``, ``p_perm`` (one-sided normal tail; 1 when the null has no spread; NaN for
        descriptive roles), ``n_queries`` (queries averaged over), ``task_relation`` (True for
        the task's own relations).
    """
    records = []
    for role in sums.mass.sums:
        n = sums.mass.counts[role]
        score = sums.mass.mean(role).numpy()
        descriptive = role in DESCRIPTIVE_ROLES or role in INIT_ONLY_ROLES  # no permutation null
        chance = math.nan if role in OVERLAP_ROLES or not n else sums.chance_sum[role] / n
        var = sums.perm_var_sum[role].cpu() if n else None  # the table's: handed back (host)
        sd = (var.clamp(min=0).sqrt() / n).numpy() if n else score * np.nan
        even = (
            sums.evenness.mean(role).numpy()
            if sums.evenness.counts.get(role)
            else np.full_like(score, np.nan)
        )
        for layer in range(score.shape[0]):
            for head in range(score.shape[1]):
                value, spread = float(score[layer, head]), float(sd[layer, head])
                z, p = _normal_tail(value, chance, spread, descriptive)
                records.append(
                    {
                        "layer": layer,
                        "head": head,
                        "head_label": head_label(layer, head),
                        "role": role,
                        "task_relation": role in task_relations,
                        "score": value,
                        "chance": chance,
                        "effect": _effect(value, chance),
                        "evenness": float(even[layer, head]),
                        "perm_std": math.nan if descriptive else spread,
                        "z_perm": z,
                        "p_perm": p,
                        "n_queries": int(n),
                    }
                )
    frame = pd.DataFrame(records, columns=ROLE_COLUMNS)
    return frame.sort_values(["layer", "head"], kind="stable", ignore_index=True)


def _effect(score: float, chance: float) -> float:
    if math.isnan(chance) or math.isnan(score) or chance >= 1.0:
        return math.nan
    return (score - chance) / (1.0 - chance)


def _normal_tail(score: float, chance: float, sd: float, descriptive: bool) -> tuple[float, float]:
    """``(z, one-sided p)`` of the score against the permutation null."""
    if descriptive or math.isnan(score) or math.isnan(chance):
        return math.nan, math.nan
    if sd <= 1e-12:
        # Every shuffle gives the same mass (e.g. a uniform head): nothing to reject.
        return 0.0, 1.0
    z = (score - chance) / sd
    return z, float(stats.norm.sf(z))


def role_scores(
    model: HookedMHATransformer,
    data: Task | tuple[Tensor, Tensor],
    *,
    task: Task | None = None,
    n_eval: int = DEFAULT_N_EVAL,
    batch_size: int = 512,
) -> pd.DataFrame:
    """Role scores of every head with their permutation null (see the module docstring).

    Args:
        model: The model.
        data: A Task (its fixed evaluation set of ``n_eval`` sequences, held out from
            training) or ``(tokens, padding_mask)``.
        task: Whose relations to add to the generic roles (default: ``data`` when a Task).
        n_eval: Sequences of a task's evaluation set to use.
        batch_size: Sequences per forward pass.

    Returns:
        The :func:`role_frame` table.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> table = role_scores(handbuilt_model(["previous", "uniform"], d_head=18), task)
        >>> table.query("role == 'previous'").score.round(3).tolist()
        [1.0, 0.159]
    """
    if isinstance(data, Task):
        task = data if task is None else task
        batch = data.eval_batch(n_eval)
        tokens, mask = batch.tokens, batch.padding_mask
    else:
        tokens, mask = data
    templates = role_templates(tokens, mask, task=task, causal=model.cfg.causal)
    relations = tuple(task.relations(tokens[:1], mask[:1])) if task is not None else ()
    sums = capture_role_sums(model, tokens, mask, templates, outputs=False, batch_size=batch_size)
    return role_frame(sums, relations)


# ----------------------------------------------------------------------------- Monte Carlo


def permutation_null_samples(
    patterns: Float[Tensor, "n T T"],
    template: Float[Tensor, "n T T"],
    visible: Bool[Tensor, "n T T"],
    *,
    n_permutations: int = 1000,
    generator: torch.Generator | None = None,
    chunk: int = 64,
) -> Float[Tensor, " M"]:
    """Monte Carlo draws of one head's role score under the permutation null.

    Each draw shuffles every counted query's weights over the keys it may see (a random
    bijection of its visible keys, drawn independently per query and per draw) and recomputes
    the score. The exact moments that :func:`role_scores` uses are the mean and variance of
    this distribution; this function is the slow, assumption-free check.

    Args:
        patterns: One head's attention ``[n, T, T]`` (rows of padding queries 0).
        template: The role's 0/1 template ``[n, T, T]``.
        visible: Which keys each query may see ``[n, T, T]``
            (:func:`~mhainterp.capture.core.visible_keys`).
        n_permutations: Number of draws ``M``.
        generator: Source of randomness (seed 0 when None).
        chunk: Draws per vectorised step (bounds memory at ``chunk * n * T * T``).

    Returns:
        float64 ``[M]`` scores.

    Example:
        >>> w = torch.eye(4)[None].roll(-1, dims=-1)  # a head that looks one key ahead
        >>> vis = torch.ones(1, 4, 4, dtype=torch.bool)
        >>> draws = permutation_null_samples(w, torch.eye(4)[None], vis, n_permutations=200)
        >>> 0.1 < float(draws.mean()) < 0.4
        True
    """
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    w = patterns.double()
    on = template.double() * visible.double()
    rows = statistic_queries(visible) & (on.sum(-1) > 0)  # (n, T)
    T = w.shape[-1]
    key = torch.arange(T, dtype=torch.float64, device=w.device)
    # Visible keys first in natural order, then the invisible ones: the slots a bijection fills.
    natural = torch.argsort(torch.where(visible, key / T, 1.0 + key), dim=-1)  # (n, T, T)
    draws = []
    for start in range(0, n_permutations, chunk):
        m = min(chunk, n_permutations - start)
        u = torch.rand(
            (m, *w.shape), generator=generator, dtype=torch.float64, device=DRAW_DEVICE
        ).to(w.device)
        shuffled = torch.argsort(torch.where(visible, u, 1.0 + key), dim=-1)  # (m, n, T, T)
        moved = torch.gather(w.expand(m, *w.shape), -1, shuffled)
        permuted = torch.zeros_like(moved).scatter_(-1, natural.expand(m, *w.shape), moved)
        mass = (permuted * on).sum(-1)  # (m, n, T)
        draws.append((mass * rows).sum((1, 2)) / rows.sum())
    return torch.cat(draws)
