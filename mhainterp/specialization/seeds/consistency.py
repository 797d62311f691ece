"""Cross-seed consistency: do the same roles appear in every seed?

Each head of each run gets a **role profile**: its effect sizes on the testable roles, clipped
to ``[0, 1]`` (0 = at chance or below). For two runs with the same task and head count, the
profile similarity of every head pair is the cosine of their profiles (1 for two all-zero
profiles, 0 for an all-zero against a non-zero one), heads are matched one-to-one by the
Hungarian assignment (:func:`mhainterp.similarity.match_heads`), and the **consistency** of the
pair is the mean similarity of the matched heads.

Two references, both printed:

- **random matching**: the mean similarity of a uniformly random one-to-one matching, which is
  exactly the mean of all entries of the similarity matrix. The *margin* is consistency minus
  this; a max over matchings always beats it, so the margin alone proves nothing;
- **head-shuffled null** (the null the p-value is computed against): the heads of all seeds are
  pooled and dealt out again at random into seeds of the same size, and the consistency of the
  dealt seeds is computed the same way (Hungarian matching). Each head keeps its whole profile,
  so every role keeps its marginal distribution over heads; only which seed a head belongs to
  is random. If every seed draws its heads independently from one common pool (for example,
  every head shares one common role), the observed consistency is just another draw of this
  null, and p is uniform. ``p = (1 + #{null >= observed}) / (1 + M)``, floor ``1 / (1 + M)``.

Label agreement (when labels are given) is the share of matched heads with the same label, next
to the agreement a random matching would give by chance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

from mhainterp.similarity import match_heads
from mhainterp.specialization.nulls import HEADS_SHUFFLED_NULL
from mhainterp.specialization.where.roles import DESCRIPTIVE_ROLES
from mhainterp.validation import invalid

__all__ = [
    "CONSISTENCY_COLUMNS",
    "cross_seed_consistency",
    "profile_similarity",
    "role_profiles",
]

CONSISTENCY_COLUMNS = [
    "run_a",
    "run_b",
    "n_heads",
    "consistency",
    "random_matching",
    "null_shuffled",
    "label_agreement",
    "label_agreement_random",
    "matched",
]


def role_profiles(roles: pd.DataFrame) -> pd.DataFrame:
    """Head x role matrix of effect sizes clipped to ``[0, 1]`` (descriptive roles left out).

    Args:
        roles: One run's role table (``head_label, role, effect``).

    Example:
        >>> roles = pd.DataFrame({"head_label": ["L0H0", "L0H0"], "role": ["a", "b"],
        ...                       "effect": [1.4, -0.2]})
        >>> role_profiles(roles).values.tolist()
        [[1.0, 0.0]]
    """
    testable = roles[~roles["role"].isin(DESCRIPTIVE_ROLES)]
    table = testable.pivot_table(
        index="head_label", columns="role", values="effect", sort=False, dropna=False
    )
    # A role whose effect is NaN for every head (a template that covers the whole visible
    # prefix, so chance is 1 and the effect undefined) is dropped by pivot_table: put it back
    # as "no effect", and keep heads whose every effect is NaN.
    heads = list(dict.fromkeys(testable["head_label"]))
    table = table.reindex(index=heads, columns=list(dict.fromkeys(testable["role"])))
    return table.fillna(0.0).clip(0.0, 1.0)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of every row of ``a`` with every row of ``b``, zero rows handled."""
    norm_a, norm_b = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    zero_a, zero_b = norm_a < 1e-12, norm_b < 1e-12
    dots = a @ np.swapaxes(b, -1, -2)
    cos = dots / np.maximum(norm_a[..., :, None] * norm_b[..., None, :], 1e-300)
    cos = np.where(zero_a[..., :, None] ^ zero_b[..., None, :], 0.0, cos)
    return np.where(zero_a[..., :, None] & zero_b[..., None, :], 1.0, cos)


def profile_similarity(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Cosine similarity of every head of profile table ``a`` with every head of ``b``.

    Example:
        >>> a = pd.DataFrame([[1.0, 0.0]], index=["L0H0"], columns=["x", "y"])
        >>> b = pd.DataFrame([[0.0, 1.0], [1.0, 0.0]], index=["L0H0", "L0H1"],
        ...                  columns=["x", "y"])
        >>> profile_similarity(a, b).values.tolist()
        [[0.0, 1.0]]
    """
    columns = [c for c in a.columns if c in b.columns]
    values = _cosine(a[columns].to_numpy(float), b[columns].to_numpy(float))
    frame = pd.DataFrame(values, index=a.index, columns=b.index)
    frame.index.name, frame.columns.name = "head_a", "head_b"
    return frame


def _hungarian_mean(similarity: np.ndarray) -> float:
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return float(similarity[rows, cols].mean())


def _consistency(profiles: list[np.ndarray]) -> tuple[float, list[float]]:
    """Mean over run pairs of the Hungarian mean similarity, and the per-pair values."""
    values = [_hungarian_mean(_cosine(a, b)) for a, b in itertools.combinations(profiles, 2)]
    return float(np.mean(values)), values


def _head_shuffled(
    profiles: list[np.ndarray], n_shuffles: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The head-shuffled null: ``(overall, per_pair)`` of shapes ``(M,)`` and ``(M, n_pairs)``.

    Each draw pools every seed's heads (rows), permutes them, deals them back into groups of
    the seeds' sizes and computes :func:`_consistency` of the dealt groups."""
    pooled = np.concatenate(profiles)
    cuts = np.cumsum([len(p) for p in profiles])[:-1]
    overall = np.empty(n_shuffles)
    per_pair = np.empty((n_shuffles, math.comb(len(profiles), 2)))
    for i in range(n_shuffles):
        dealt = np.split(pooled[rng.permutation(len(pooled))], cuts)
        overall[i], values = _consistency(dealt)
        per_pair[i] = values
    return overall, per_pair


def _label_agreement(
    matched: pd.DataFrame, labels_a: Mapping[str, str], labels_b: Mapping[str, str]
) -> tuple[float, float]:
    pairs = matched.dropna(subset=["head_a", "head_b"])
    same = [labels_a.get(a) == labels_b.get(b) for a, b in zip(pairs["head_a"], pairs["head_b"])]
    counts_a = pd.Series(list(labels_a.values())).value_counts()
    counts_b = pd.Series(list(labels_b.values())).value_counts()
    chance = sum(counts_a.get(k, 0) * counts_b.get(k, 0) for k in counts_a.index)
    return float(np.mean(same)) if same else math.nan, chance / (len(labels_a) * len(labels_b))


def cross_seed_consistency(
    roles: Mapping[str, pd.DataFrame],
    labels: Mapping[str, Mapping[str, str]] | None = None,
    *,
    n_shuffles: int = 200,
    seed: int = 0,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Consistency of role profiles across runs (seeds) of one task and head count.

    Args:
        roles: Run id -> that run's role table (``head_label, role, effect``); at least 2 runs.
        labels: Run id -> {head label -> label}; adds label agreement.
        n_shuffles: Draws of the head-shuffled null (module docstring).
        seed: Seed of the null's generator.

    Returns:
        ``(pairs, summary)``: ``pairs`` has one row per run pair, columns
        :data:`CONSISTENCY_COLUMNS` (``matched`` lists ``"L0H1=L0H3"`` pairs; ``null_shuffled``
        that pair's head-shuffled null mean); ``summary`` has ``consistency,
        random_matching, margin`` (consistency - random matching), ``null`` (its name,
        :data:`~mhainterp.specialization.nulls.HEADS_SHUFFLED_NULL`), ``null_shuffled,
        null_high`` (the null's mean and 95% quantile),
        ``p_value, p_floor, label_agreement, label_agreement_random, n_runs, n_pairs`` (means
        over run pairs).

    Example:
        >>> pairs, summary = cross_seed_consistency({"s0": roles0, "s1": roles1})  # doctest: +SKIP
    """
    if len(roles) < 2:
        raise invalid("roles", f"{len(roles)} run(s)", "at least 2 runs")
    rng = np.random.default_rng(seed)
    profiles = {run: role_profiles(table) for run, table in roles.items()}
    columns = list(dict.fromkeys(c for p in profiles.values() for c in p.columns))
    profiles = {run: p.reindex(columns=columns, fill_value=0.0) for run, p in profiles.items()}
    null, null_pairs = _head_shuffled(
        [p.to_numpy(float) for p in profiles.values()], n_shuffles, rng
    )
    rows = []
    for k, (run_a, run_b) in enumerate(itertools.combinations(profiles, 2)):
        sim = profile_similarity(profiles[run_a], profiles[run_b])
        matched = match_heads(sim)
        pairs = matched.dropna(subset=["head_a", "head_b"])
        agreement, agreement_random = (
            _label_agreement(matched, labels[run_a], labels[run_b])
            if labels is not None
            else (math.nan, math.nan)
        )
        rows.append(
            {
                "run_a": run_a,
                "run_b": run_b,
                "n_heads": len(sim.index),
                "consistency": float(pairs["similarity"].mean()),
                "random_matching": float(sim.to_numpy().mean()),
                "null_shuffled": float(null_pairs[:, k].mean()),
                "label_agreement": agreement,
                "label_agreement_random": agreement_random,
                "matched": ",".join(f"{a}={b}" for a, b in zip(pairs["head_a"], pairs["head_b"])),
            }
        )
    table = pd.DataFrame(rows, columns=CONSISTENCY_COLUMNS)
    observed = float(table["consistency"].mean())
    random_matching = float(table["random_matching"].mean())
    summary = {
        "consistency": observed,
        "random_matching": random_matching,
        "margin": observed - random_matching,
        "null": HEADS_SHUFFLED_NULL,
        "null_shuffled": float(null.mean()),
        "null_high": float(np.quantile(null, 0.95)),
        "p_value": float((1 + (null >= observed - 1e-12).sum()) / (1 + n_shuffles)),
        "p_floor": 1.0 / (1 + n_shuffles),
        "label_agreement": float(table["label_agreement"].mean()),
        "label_agreement_random": float(table["label_agreement_random"].mean()),
        "n_runs": len(roles),
        "n_pairs": len(table),
    }
    return table, summary
