"""The initialisation null and the combined, corrected p-values of the role scores.

**Initialisation null** (is the score more than the architecture gives for free?). The same
architecture (``ModelConfig`` with only the seed changed) is built untrained for ``n_init`` seeds,
*matched* to the run: seeds ``seed, seed + 1, ...`` where ``seed`` is the run's own, so the first
null model is exactly the run's starting point. Each role's null pool is the scores of every head
of every null model (``n_init * layers * heads`` values). A head's p-value is the one-sided
*predictive* t-test of a new draw from that pool,

    t = (score - mean) / (sd * sqrt(1 + 1/N)),   df = N - 1,

which is exact when the pool is normal (its mean and sd are estimated from the ``N`` draws).

A role without a permutation null (:data:`~.roles.INIT_ONLY_ROLES`) draws its pool from at
least :data:`MIN_INIT_ONLY_POOL` untrained heads (more seeds, ``seed + n_init, ...``, where
``n_init`` models hold fewer; :func:`init_null_pool`). Its score, an overlap with uniform
attention, is bounded by 1, while untrained heads sit at 0.75-0.81 with a spread of
0.02-0.05: from the 4 heads of a one-head model's 4 untrained seeds the predictive t-test (3
degrees of freedom) gives p >= 0.02 even to a perfectly even head, above alpha after Holm
over the head's roles, so a SelectorWidth head that scores 1.00 and carries the task came out
"unspecialized". The other roles keep the ``n_init`` matched models alone.

**Combining the nulls.** A head holds a role only if it beats *both* nulls, so the p-value of
the head x role hypothesis is ``max(p_perm, p_init)`` (an intersection-union test: valid for the
union of the two null hypotheses). A role without a permutation null
(:data:`~.roles.INIT_ONLY_ROLES`: ``uniform+sink``, scored by an overlap no key shuffle changes) is
tested against the initialisation null alone, ``p = p_init``, with the effect measured from the
untrained heads: ``(score - init_mean) / (1 - init_mean)``, the share of the way from an
untrained head's spread to perfectly even. These p-values are adjusted over every testable
head x role pair of a run (Holm by default, :func:`~mhainterp.stats.adjust_pvalues`), and a
role is *significant* when ``p_adj < alpha`` and its effect size is at least ``min_effect``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.pretrained import random_init_models
from mhainterp.protocol import BridgedModel
from mhainterp.specialization.where.roles import (
    DESCRIPTIVE_ROLES,
    INIT_ONLY_ROLES,
    capture_role_sums,
    role_frame,
)
from mhainterp.stats import adjust_pvalues
from mhainterp.validation import check_int

__all__ = [
    "MIN_INIT_ONLY_POOL",
    "combine_nulls",
    "init_models",
    "init_null_pool",
    "init_null_scores",
    "init_null_summary",
    "init_only_seeds",
    "init_p_values",
    "matched_seeds",
]

MIN_INIT_ONLY_POOL = 32
"""Untrained heads the initialisation null of an init-only role holds at least (the module
docstring): with 32 the predictive t-test has 31 degrees of freedom, and a head at 1.00 against
untrained heads at 0.81 +- 0.05 gets p < 1e-3."""


def matched_seeds(seed: int, n_init: int) -> list[int]:
    """The initialisation seeds matched to a run of seed ``seed``: ``seed, seed + 1, ...``.

    Example:
        >>> matched_seeds(3, 4)
        [3, 4, 5, 6]
    """
    check_int("n_init", n_init, minimum=2)  # a null needs spread
    return [seed + i for i in range(n_init)]


def init_only_seeds(seed: int, n_init: int, heads_per_model: int) -> list[int]:
    """The seeds of the untrained models that the init-only roles' pool adds after the
    matched ``n_init``, so that it holds at least :data:`MIN_INIT_ONLY_POOL` heads (none when
    ``n_init`` models hold that many).

    Example:
        >>> init_only_seeds(3, 4, 1)[:2], len(init_only_seeds(3, 4, 1)), init_only_seeds(0, 4, 8)
        ([7, 8], 28, [])
    """
    check_int("heads_per_model", heads_per_model, minimum=1)
    n_models = max(n_init, math.ceil(MIN_INIT_ONLY_POOL / heads_per_model))
    return [seed + i for i in range(n_init, n_models)]


def init_models(
    config: ModelConfig | BridgedModel, seeds: Sequence[int]
) -> list[HookedMHATransformer] | list[BridgedModel]:
    """Untrained models of ``config``'s architecture, one per seed (nothing else changes).

    ``config`` may be a pretrained model itself: its architecture with the random
    initialisation of ``transformers`` (:func:`mhainterp.pretrained.random_init_models`).

    Example:
        >>> cfg = ModelConfig(d_model=16, n_heads=2, n_ctx=4, d_vocab=3)
        >>> [m.cfg.seed for m in init_models(cfg, [0, 1])]
        [0, 1]
    """
    if isinstance(config, BridgedModel):  # a pretrained model: its architecture, random init
        return random_init_models(config, list(seeds))
    base = config.to_dict()
    return [HookedMHATransformer(ModelConfig.from_dict({**base, "seed": s})).eval() for s in seeds]


def init_null_scores(
    config: ModelConfig | BridgedModel,
    tokens: Tensor,
    padding_mask: Tensor,
    templates: Mapping[str, Tensor],
    seeds: Sequence[int],
    *,
    batch_size: int = 512,
    progress: bool = False,
) -> pd.DataFrame:
    """Role scores of the untrained null models on the same data and templates.

    Returns:
        :func:`~mhainterp.specialization.where.roles.role_frame` columns plus ``init_seed`` (first),
        one block per seed.

    Example:
        >>> scores = init_null_scores(cfg, tokens, mask, templates, [0, 1])  # doctest: +SKIP
    """
    frames = []
    models = init_models(config, seeds)
    for seed, model in tqdm(
        list(zip(seeds, models, strict=True)), desc="init null", disable=not progress, leave=False
    ):
        sums = capture_role_sums(
            model, tokens, padding_mask, templates, outputs=False, batch_size=batch_size
        )
        frame = role_frame(sums)
        frame.insert(0, "init_seed", seed)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def init_null_pool(
    config: ModelConfig | BridgedModel,
    tokens: Tensor,
    padding_mask: Tensor,
    templates: Mapping[str, Tensor],
    seed: int,
    n_init: int,
    *,
    batch_size: int = 512,
    progress: bool = False,
) -> pd.DataFrame:
    """The initialisation null's pool: every role scored by the ``n_init`` models matched to
    ``seed`` (:func:`matched_seeds`), and the init-only roles (:data:`~.roles.INIT_ONLY_ROLES`)
    also by the models of :func:`init_only_seeds`, so that their pool holds at least
    :data:`MIN_INIT_ONLY_POOL` heads.

    Returns:
        :func:`init_null_scores`' columns, the matched seeds' blocks first.

    Example:
        >>> pool = init_null_pool(cfg, tokens, mask, templates, 0, 4)  # doctest: +SKIP
    """
    scores = init_null_scores(
        config,
        tokens,
        padding_mask,
        templates,
        matched_seeds(seed, n_init),
        batch_size=batch_size,
        progress=progress,
    )
    only = {name: t for name, t in templates.items() if name in INIT_ONLY_ROLES}
    shape = getattr(config, "cfg", config)  # a pretrained model's, or our config itself
    more = init_only_seeds(seed, n_init, shape.n_layers * shape.n_heads)
    if not only or not more:
        return scores
    extra = init_null_scores(
        config, tokens, padding_mask, only, more, batch_size=batch_size, progress=progress
    )
    return pd.concat([scores, extra], ignore_index=True)


def init_null_summary(init_scores: pd.DataFrame) -> pd.DataFrame:
    """Per role: ``role, init_mean, init_std`` (ddof=1) and ``init_n`` of the null pool.

    Example:
        >>> pool = pd.DataFrame({"role": ["a", "a", "a"], "score": [0.1, 0.2, 0.3]})
        >>> init_null_summary(pool).round(3).values.tolist()
        [['a', 0.2, 0.1, 3]]
    """
    grouped = init_scores.groupby("role", sort=False)["score"]
    return pd.DataFrame(
        {
            "role": list(grouped.groups),
            "init_mean": grouped.mean().to_numpy(),
            "init_std": grouped.std(ddof=1).to_numpy(),
            "init_n": grouped.count().to_numpy().astype(int),
        }
    )


def _predictive_p(score: float, mean: float, sd: float, n: int) -> tuple[float, float]:
    """``(z, one-sided p)`` of ``score`` as a new draw from a normal pool of ``n`` values."""
    if n < 2 or math.isnan(score) or math.isnan(sd):
        return math.nan, math.nan
    if sd <= 1e-12:
        # A pool with no spread: anything above it is beyond every null draw.
        return (math.inf, 0.0) if score > mean + 1e-9 else (0.0, 1.0)
    z = (score - mean) / sd
    t = z / math.sqrt(1.0 + 1.0 / n)
    return z, float(stats.t.sf(t, df=n - 1))


def init_p_values(roles: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Add the initialisation null to a role table: ``init_mean, init_std, init_n, z_init,
    p_init`` (``z_init = (score - init_mean) / init_std``; NaN for descriptive roles).

    Example:
        >>> roles = pd.DataFrame({"role": ["a"], "score": [0.9]})
        >>> summary = pd.DataFrame({"role": ["a"], "init_mean": [0.1], "init_std": [0.1],
        ...                         "init_n": [8]})
        >>> round(float(init_p_values(roles, summary).z_init[0]), 3)
        8.0
    """
    out = roles.merge(summary, on="role", how="left", sort=False)
    z_p = [
        (math.nan, math.nan)
        if role in DESCRIPTIVE_ROLES
        else _predictive_p(score, mean, sd, int(n) if not math.isnan(n) else 0)
        for role, score, mean, sd, n in zip(
            out["role"], out["score"], out["init_mean"], out["init_std"], out["init_n"]
        )
    ]
    out["z_init"] = [z for z, _ in z_p]
    out["p_init"] = [p for _, p in z_p]
    return out


def combine_nulls(
    roles: pd.DataFrame, *, alpha: float, correction: str, min_effect: float
) -> pd.DataFrame:
    """Add ``p`` (= max of ``p_perm`` and ``p_init``; ``p_init`` alone for
    :data:`~.roles.INIT_ONLY_ROLES`, whose ``effect`` is then measured from the untrained
    heads), ``p_adj`` (corrected over the table's testable rows) and ``significant`` (``p_adj <
    alpha`` and ``effect >= min_effect``).

    Example:
        >>> t = pd.DataFrame({"p_perm": [0.001, 0.02], "p_init": [0.004, 0.001],
        ...                   "effect": [0.9, 0.9]})
        >>> combine_nulls(t, alpha=0.05, correction="holm", min_effect=0.3).p_adj.tolist()
        [0.008, 0.02]
        >>> u = pd.DataFrame({"role": ["uniform+sink"], "p_perm": [np.nan], "p_init": [1e-6],
        ...                   "effect": [np.nan], "score": [1.0], "init_mean": [0.76]})
        >>> row = combine_nulls(u, alpha=0.05, correction="holm", min_effect=0.3).iloc[0]
        >>> float(row.p), float(row.effect), bool(row.significant)
        (1e-06, 1.0, True)
    """
    out = roles.copy()
    p_perm = out["p_perm"].to_numpy(dtype=float)
    p_init = out["p_init"].to_numpy(dtype=float)
    p = np.where(np.isnan(p_perm) | np.isnan(p_init), np.nan, np.fmax(p_perm, p_init))
    if "role" in out.columns:  # no permutation null: the initialisation null alone
        init_only = out["role"].isin(INIT_ONLY_ROLES).to_numpy()
        p = np.where(init_only, p_init, p)
        mean = out["init_mean"].to_numpy(dtype=float) if "init_mean" in out.columns else p * np.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            from_init = (out["score"].to_numpy(dtype=float) - mean) / (1.0 - mean)
        out["effect"] = np.where(init_only, from_init, out["effect"].to_numpy(dtype=float))
    out["p"] = p
    out["p_adj"] = adjust_pvalues(p, correction)
    effect = out["effect"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        out["significant"] = (out["p_adj"].to_numpy() < alpha) & (effect >= min_effect)
    return out
