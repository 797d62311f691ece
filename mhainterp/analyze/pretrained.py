"""The battery on a pretrained model and real text: what ``mhainterp analyze --model`` writes.

``analyze_pretrained(model, text, out)`` writes into ``out`` (each PNG beside its CSV)::

    provenance.json       source, package version, quantisation, sentences, settings
    roles.csv / .png      share of attention per text relation per head, the permutation null,
                          the random-weight null (same architecture, ``n_init`` seeds), p-values
    categories.csv        Clark et al. (2019) category per head: previous, next, first
                          (BOS/[CLS]), last ([SEP]), punctuation, self, broad, or other
    attribution.csv       attribution patching for every head, zero and mean (next-token models)
    verified.csv / attribution_vs_exact.png
                          exact engine ablation of the top-k and a random sample
    agreement.csv         Spearman, Pearson and top-k overlap of attribution vs exact, per method
    zero_vs_mean.csv/.png both methods side by side on the verified heads; where they disagree
    pairwise.csv          joint ablation of the strongest verified heads (backup / overlap)
    prune.csv             pruning curve over the verified heads only (mean ablation, removed
                          in order of their exact damage; the other heads stay)
    summary.md            the headline numbers in sentences

Next-token models are scored by the mean cross-entropy of the next token (the engine's
``loss``), embedding-only models (MiniLM) by ``1 - cos`` of the mean-pooled output to the clean
one (:class:`~mhainterp.scoring.CleanOutputMetric`); an embedding model has no useful gradient
at the clean output, so its heads are all ablated exactly instead of attributed.

Example:
    >>> analyze_pretrained("smollm2", "stdlib", "runs/smollm2", n_eval=64)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from mhainterp.ablation.engine import evaluate_head_sets
from mhainterp.ablation.replacement import CleanCache
from mhainterp.ablation.tables import pairwise_ablation
from mhainterp.attribution import (
    attribution_agreement,
    attribution_patching,
    prune_curve,
    verify_attribution,
)
from mhainterp.heads import all_heads, head_label
from mhainterp.io import write_csv, write_json, write_text
from mhainterp.pretrained import load_pretrained, random_init_models
from mhainterp.protocol import BridgedModel, HookedModel
from mhainterp.runs import PRETRAINED_ANALYSIS_FILE, check_free_folder
from mhainterp.scoring import CleanOutputMetric, pooled_output
from mhainterp.specialization.where.nulls import combine_nulls, init_null_summary, init_p_values
from mhainterp.specialization.where.roles import capture_role_sums, role_frame, role_templates
from mhainterp.tasks import Batch
from mhainterp.tasks.text import (
    TEXT_RELATIONS,
    TextRelations,
    punctuation_ids,
    read_sentences,
    stdlib_sentences,
    text_batch,
)
from mhainterp.validation import check_float, check_int

__all__ = [
    "CLARK_CATEGORIES",
    "analyze_pretrained",
    "clark_categories",
    "embedding_metric",
    "text_roles",
    "verified_heads",
    "zero_vs_mean",
]

CLARK_CATEGORIES = ("previous", "next", "first", "last", "punctuation", "self")
"""Relations a head is named after when most of its attention goes there (Clark et al. 2019;
``first`` is BOS / [CLS], ``last`` the final token / [SEP]); else ``broad`` or ``other``."""
BATCH = 16
"""Sequences per capture forward of a pretrained model."""


def sentences_of(text: str | os.PathLike[str], n: int | None = None) -> list[str]:
    """``"stdlib"``: the standard library's sentences; anything else: a text file."""
    return stdlib_sentences() if str(text) == "stdlib" else read_sentences(text)


def text_roles(
    model: BridgedModel,
    batch: Batch,
    *,
    n_init: int = 2,
    n_null: int | None = 16,
    progress: bool = False,
) -> pd.DataFrame:
    """Role scores of every head on ``batch``, against the permutation and random-weight nulls.

    Args:
        model: A :class:`~mhainterp.protocol.BridgedModel`.
        batch: Its text batch.
        n_init: Random-weight models (seeds ``0 .. n_init - 1``) in the null pool.
        n_null: Sentences the null models see (the first ``n_null``; None: all).
        progress: Show a progress bar.

    Returns:
        :func:`~mhainterp.specialization.where.roles.role_frame` columns plus ``init_mean,
        init_std, init_n, z_init, p_init, p, p_adj, significant`` (Holm, alpha 0.05, effect
        at least 0.3).
    """
    tokens, mask = batch.tokens, batch.padding_mask
    relations = TextRelations(tuple(punctuation_ids(model.tokenizer)), model.cfg.causal)
    templates = role_templates(tokens, mask, task=relations, causal=model.cfg.causal)
    sums = capture_role_sums(model, tokens, mask, templates, outputs=False, batch_size=BATCH)
    roles = role_frame(sums, TEXT_RELATIONS)
    m = len(batch) if n_null is None else min(len(batch), check_int("n_null", n_null, minimum=1))
    null_templates = {name: t[:m] for name, t in templates.items()}
    frames = []
    for seed, null in enumerate(
        tqdm(
            random_init_models(model, range(n_init)), desc="null", disable=not progress, leave=False
        )
    ):
        null_sums = capture_role_sums(
            null, tokens[:m], mask[:m], null_templates, outputs=False, batch_size=BATCH
        )
        frames.append(role_frame(null_sums).assign(init_seed=seed))
    summary = init_null_summary(pd.concat(frames, ignore_index=True))
    roles = init_p_values(roles, summary)
    return combine_nulls(roles, alpha=0.05, correction="holm", min_effect=0.3)


def clark_categories(
    roles: pd.DataFrame, *, threshold: float = 0.5, causal: bool = False
) -> pd.DataFrame:
    """One Clark et al. (2019) category per head from its role scores.

    A head is named after the relation of :data:`CLARK_CATEGORIES` with the largest share of
    its attention when that share is at least ``threshold`` and beats both nulls
    (``significant``); otherwise ``broad`` when its attention overlaps the uniform
    distribution by at least ``threshold``; otherwise ``other``. For a ``causal`` model
    ``next`` and ``last`` are left out: no query sees the next token, and only the last query
    sees the last one (there ``last`` is ``self``).

    Returns:
        ``head_label, layer, head, category, share`` (the named relation's score, or the
        uniform overlap for ``broad``) and one ``score_<relation>`` column per relation.

    Example:
        >>> rows = [("L0H0", 0, 0, "previous", 0.9, True), ("L0H0", 0, 0, "uniform", 0.2, False),
        ...         ("L0H1", 0, 1, "previous", 0.1, False), ("L0H1", 0, 1, "uniform", 0.8, False)]
        >>> t = pd.DataFrame(rows, columns=["head_label", "layer", "head", "role", "score",
        ...                                 "significant"])
        >>> clark_categories(t)["category"].tolist()
        ['previous', 'broad']
    """
    threshold = check_float("threshold", threshold, minimum=0.0, maximum=1.0)
    rows = []
    for (label, layer, head), group in roles.groupby(["head_label", "layer", "head"], sort=False):
        by_role = group.set_index("role")
        allowed = [c for c in CLARK_CATEGORIES if not (causal and c in ("next", "last"))]
        named = by_role[by_role.index.isin(allowed)]
        row = {"head_label": label, "layer": layer, "head": head}
        best = named["score"].idxmax() if len(named) else None
        if (
            best is not None
            and named.loc[best, "score"] >= threshold
            and bool(named.loc[best, "significant"])
        ):
            row.update(category=best, share=float(named.loc[best, "score"]))
        elif "uniform" in by_role.index and by_role.loc["uniform", "score"] >= threshold:
            row.update(category="broad", share=float(by_role.loc["uniform", "score"]))
        else:
            row.update(category="other", share=float("nan"))
        row.update({f"score_{r}": float(named.loc[r, "score"]) for r in named.index})
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["layer", "head"], ignore_index=True)


def zero_vs_mean(
    verified: pd.DataFrame, roles: pd.DataFrame | None = None, *, ratio: float = 3.0
) -> pd.DataFrame:
    """Zero and mean ablation side by side per verified head.

    ``disagree`` marks heads whose larger damage is at least ``ratio`` times the smaller one
    (or of the other sign), among heads whose larger damage is over 5% of the table's
    largest: removing the head's average (zero) and removing what depends on the input
    (mean) tell different stories, as for attention-sink heads. With ``roles`` the
    head's share of attention on the first token is added (``first_share``).

    Example:
        >>> v = pd.DataFrame({"head_label": ["L0H0", "L0H0", "L0H1", "L0H1"], "layer": 0,
        ...     "head": [0, 0, 1, 1], "method": ["zero", "mean"] * 2,
        ...     "exact": [0.113, 0.0044, 0.02, 0.018]})
        >>> zero_vs_mean(v)[["head_label", "disagree"]].values.tolist()
        [['L0H0', True], ['L0H1', False]]
    """
    wide = verified.pivot_table(
        index=["head_label", "layer", "head"], columns="method", values="exact"
    ).reset_index()
    wide = wide.rename(columns={"zero": "delta_zero", "mean": "delta_mean"})
    zero, mean = wide["delta_zero"], wide["delta_mean"]
    big, small = (
        zero.abs().where(zero.abs() > mean.abs(), mean.abs()),
        zero.abs().where(zero.abs() <= mean.abs(), mean.abs()),
    )
    wide["zero_over_mean"] = zero / mean.where(mean != 0)
    floor = 0.05 * float(big.max()) if len(big) else 0.0  # ignore heads that do ~nothing
    wide["disagree"] = (big > floor) & ((zero * mean < 0) | (big >= ratio * small))
    if roles is not None:
        first = roles[roles["role"] == "first"].set_index("head_label")["score"]
        wide["first_share"] = wide["head_label"].map(first)
    return wide.sort_values(["layer", "head"], ignore_index=True)


def embedding_metric(model: HookedModel, batch: Batch) -> CleanOutputMetric:
    """The clean pooled output of every sentence (one forward), as the engine's metric: an
    encoder without a trained output head (MiniLM) is scored by 1 - cos of its sentence embedding
    (the explorer's clicks use it too)."""
    with torch.no_grad():
        pooled = torch.cat(
            [
                pooled_output(model.logits(p.tokens, p.padding_mask), p.padding_mask)
                for p in (batch[s : s + BATCH] for s in range(0, len(batch), BATCH))
            ]
        )
    return CleanOutputMetric("embedding", pooled, batch.padding_mask)


def _exact_all(model: HookedModel, batch: Batch, metric: CleanOutputMetric) -> pd.DataFrame:
    """Every head ablated exactly, zero and mean, scored by ``metric`` (small models)."""
    heads = [head_label(*pair) for pair in all_heads(model.cfg.n_layers, model.cfg.n_heads)]
    cache = CleanCache()
    frames = []
    for method in ("zero", "mean"):
        result = evaluate_head_sets(
            model, batch, [[], *([h] for h in heads)], method, cache=cache, metric=metric
        )
        losses = [m["loss"] for m in result.metrics()]
        frames.append(
            pd.DataFrame(
                {
                    "head_label": heads,
                    "layer": [int(h[1 : h.index("H")]) for h in heads],
                    "head": [int(h[h.index("H") + 1 :]) for h in heads],
                    "method": method,
                    "chosen": "all",
                    "attribution": float("nan"),
                    "exact": [v - losses[0] for v in losses[1:]],
                    "baseline_loss": losses[0],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _verified(
    model: HookedModel, batch: Batch, attribution: pd.DataFrame, top_k: int, n_random: int
) -> pd.DataFrame:
    """Exact zero and mean ablation of one set: each method's top-k and a random sample."""
    cache = CleanCache()
    chosen = {
        m: verify_attribution(model, batch, attribution, m, top_k=top_k, n_random=0)
        for m in ("zero", "mean")
    }
    top = list(dict.fromkeys([*chosen["zero"].head_label, *chosen["mean"].head_label]))
    others = attribution.drop_duplicates("head_label")
    others = others[~others["head_label"].isin(top)]["head_label"].tolist()
    draw = torch.randperm(len(others), generator=torch.Generator().manual_seed(0))[:n_random]
    labels = top + [others[i] for i in sorted(draw.tolist())]
    frames = []
    for method in ("zero", "mean"):
        result = evaluate_head_sets(model, batch, [[], *([h] for h in labels)], method, cache=cache)
        losses = [m["loss"] for m in result.metrics()]
        estimate = attribution[attribution["method"] == method].set_index("head_label")
        frame = estimate.loc[labels, ["layer", "head", "method", "attribution"]].reset_index()
        frame.insert(4, "chosen", ["top_k" if h in top else "random" for h in labels])
        frame["exact"] = [v - losses[0] for v in losses[1:]]
        frame["baseline_loss"] = losses[0]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def verified_heads(verified: pd.DataFrame) -> list[str]:
    """The heads ablated exactly (top-k and random sample), in their table order: the set
    pairwise ablation and pruning of a pretrained model run on.

    Example:
        >>> verified_heads(pd.DataFrame({"head_label": ["L3H1", "L0H2", "L3H1"]}))
        ['L3H1', 'L0H2']
    """
    return list(dict.fromkeys(verified["head_label"]))


def analyze_pretrained(
    model: BridgedModel | str | os.PathLike[str],
    text: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    n_eval: int = 64,
    n_init: int = 2,
    n_null: int | None = 16,
    top_k: int = 8,
    n_random: int = 8,
    n_pairwise: int = 3,
    max_len: int = 48,
    ablation: bool = True,
    bos: bool = True,
    progress: bool = False,
) -> list[Path]:
    """Run the battery on a pretrained model and write its tables and figures into ``out``.

    Args:
        model: A loaded model or what :func:`~mhainterp.pretrained.load_pretrained` takes.
        text: ``"stdlib"`` or a UTF-8 text file (one sentence per line).
        out: The folder to write into (created).
        n_eval: Sentences to analyse (at most as many as the text has).
        n_init: Random-weight models in the null of the role scores.
        n_null: Sentences the null models see.
        top_k, n_random: Heads verified exactly per method: the attribution's top-k and a
            random sample of the rest (next-token models; embedding models verify all).
        n_pairwise: Pairwise ablation among this many verified heads of largest exact damage
            (mean ablation; 0 skips it).
        max_len: Longest tokenized sentence.
        ablation: Write the ablation tables (attribution, verified heads, zero vs mean,
            pairwise, pruning); False keeps the role scores and categories only.
        bos: Keep a decoder's BOS prefix (SmolLM2's chat marker ``<|im_start|>``;
            :func:`~mhainterp.tasks.text.text_batch`).
        progress: Show progress bars.

    Returns:
        The paths written.
    """
    from mhainterp.figures.pretrained import (
        plot_attribution_vs_exact,
        plot_roles_vs_null,
        plot_zero_vs_mean,
    )

    n_eval = check_int("n_eval", n_eval, minimum=2)
    # a verdict's folder (its provenance.json would be overwritten), a run, a sweep: refused
    check_free_folder(out, "pretrained analysis", "out")
    model = model if isinstance(model, BridgedModel) else load_pretrained(model)
    sentences = sentences_of(text)[:n_eval]
    batch = text_batch(model, sentences, max_len=max_len, bos=bos)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        write_json(
            out / "provenance.json",
            {
                **model.provenance,
                "architecture": model.cfg.architecture,
                "objective": model.cfg.objective,
                "text": str(text),
                "n_sentences": len(batch),
                "n_tokens": int(batch.padding_mask.sum()),
                "n_init": n_init,
                "n_null": n_null,
                "bos_prefix": bos,
                "ablation": ablation,
            },
        )
    ]
    steps = tqdm(total=4, desc="analyze (pretrained)", disable=not progress)
    roles = text_roles(model, batch, n_init=n_init, n_null=n_null, progress=progress)
    steps.update()
    title = f"{model.provenance.get('source', '')}: attention share vs random-weight null"
    written.append(plot_roles_vs_null(roles, out / "roles.png", title=title))
    written.append(out / "roles.csv")
    categories = clark_categories(roles, causal=model.cfg.causal)
    written.append(write_csv(out / PRETRAINED_ANALYSIS_FILE, categories))  # marks the folder
    if not ablation:  # --no-ablation: the role scores and categories only
        steps.close()
        summary = _summary(model, batch, categories, None, None)
        written.append(write_text(out / "summary.md", summary))
        return written
    if model.cfg.objective == "next_token":
        attribution = attribution_patching(model, batch, ("zero", "mean"), batch_size=BATCH)
        written.append(write_csv(out / "attribution.csv", attribution))
        steps.update()
        verified = _verified(model, batch, attribution, top_k, n_random)
    else:
        steps.update()
        verified = _exact_all(model, batch, embedding_metric(model, batch))
    steps.update()
    agreement = None
    if verified["attribution"].notna().any():
        agreement = attribution_agreement(verified)
        written.append(write_csv(out / "agreement.csv", agreement))
        written.append(plot_attribution_vs_exact(verified, out / "attribution_vs_exact.png"))
    written.append(write_csv(out / "verified.csv", verified))
    both = zero_vs_mean(verified, roles)
    written.append(plot_zero_vs_mean(both, out / "zero_vs_mean.png"))
    pairwise = None
    if n_pairwise >= 2 and model.cfg.objective == "next_token":
        strongest = both.nlargest(n_pairwise, "delta_mean")["head_label"].tolist()
        pairwise = pairwise_ablation(model, batch, "mean", heads=strongest)
        written.append(write_csv(out / "pairwise.csv", pairwise))
    if model.cfg.objective == "next_token":  # attribution chose the set: prune only it
        curve = prune_curve(model, batch, "mean", heads=verified_heads(verified), rescore=False)
        written.append(write_csv(out / "prune.csv", curve))
    steps.update()
    steps.close()
    summary = _summary(model, batch, categories, agreement, both)
    written.append(write_text(out / "summary.md", summary))
    return written


def _summary(
    model: BridgedModel,
    batch: Batch,
    categories: pd.DataFrame,
    agreement: pd.DataFrame | None,
    both: pd.DataFrame | None,
) -> str:
    """The headline numbers of an analysis in Markdown sentences."""
    p = model.provenance
    quantised = str(p.get("quantisation") or "none")
    n, tokens = len(batch), int(batch.padding_mask.sum())
    lines = [
        f"# {p.get('upstream') or p.get('source')}",
        "",
        f"Weights: {p.get('source')}"
        + (f", dequantised from {quantised}" if quantised != "none" else "")
        + f". {n} sentence{'s' if n != 1 else ''}, {tokens} token{'s' if tokens != 1 else ''}; "
        "metric: "
        + (
            "next-token cross-entropy."
            if model.cfg.objective == "next_token"
            # what an embedding model has no attribution or pruning for, said where it is
            else "1 - cosine of the mean-pooled output to the clean one (`specialize --model`'s "
            "verdict scores each position's output instead, so its numbers differ). No "
            "attribution patching (an embedding's damage has zero gradient at the clean "
            "output): every head is ablated exactly; no pairwise or pruning table (both score "
            "cross-entropy, which an embedding model has no targets for)."
        ),
        "",
        "Clark et al. (2019) categories (share >= 0.5 and beating the permutation and "
        "random-weight nulls):",
        "",
    ]
    for category, group in categories.groupby("category", sort=False):
        heads = ", ".join(group.sort_values("share", ascending=False)["head_label"].head(12))
        lines.append(
            f"- {category}: {len(group)} head{'s' if len(group) != 1 else ''} "
            f"({heads}{', ...' if len(group) > 12 else ''})"
        )
    if agreement is not None:
        lines += ["", "Attribution patching vs exact ablation on the verified heads:", ""]
        for row in agreement.itertuples():
            lines.append(
                f"- {row.method}: Spearman {row.spearman:.2f}, Pearson {row.pearson:.2f}, "
                f"top-{row.top_k} overlap {row.top_k_overlap:.2f} ({row.n_verified} heads)"
            )
    if both is None:
        return "\n".join([*lines, "", "Ablation not run (--no-ablation)."]) + "\n"
    disagree = both[both["disagree"]].sort_values("delta_zero", ascending=False)
    lines += ["", f"Zero and mean ablation disagree on {len(disagree)} of {len(both)} heads:", ""]
    for row in disagree.head(8).itertuples():
        lines.append(
            f"- {row.head_label}: zero {row.delta_zero:+.4f}, mean {row.delta_mean:+.4f}"
            + (f", first-token share {row.first_share:.2f}" if "first_share" in both else "")
        )
    return "\n".join(lines) + "\n"
