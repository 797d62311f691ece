"""The verdict on a pretrained model: the three questions, answered as for a trained run.

:func:`specialize_pretrained` runs the same functions as a toy run
(:func:`~mhainterp.specialization.specialization_test` with
:func:`~mhainterp.specialization.division_of_labour` attached) on a pretrained model and a
:class:`~mhainterp.tasks.text.TextTask` (``"stdlib"`` or a text file), saves the tables under
``out/analysis/`` and leads with one sentence per question (:func:`headline_sentences`):

- **where** the heads look: relations held beyond the random-weight null (same architecture,
  random init) and the key permutation;
- **whom** they serve: the division index along the text axes (query token class, position
  bucket, target frequency) against noisy copies of the model (loss kept within
  ``max_accuracy_change``, here in nats or cosine distance), compared on split halves;
- **whether** they are needed: needed / backed up / dead, decided by function.

Damage on a pretrained model is the loss increase per scored position: next-token
cross-entropy (SmolLM2), or for an embedding model (MiniLM) ``1 - cos`` of each position's
output to the clean one; a "0.01" gate reads in those units.

:func:`write_pretrained_report` renders ``report.md`` and ``report.html`` from the saved files
only (``mhainterp report`` on the folder).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.analyze.verdict_cache import stage_cache
from mhainterp.io import write_json
from mhainterp.pretrained import load_pretrained
from mhainterp.protocol import BridgedModel
from mhainterp.render import (
    Bullets,
    Heading,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from mhainterp.runs import PRETRAINED_VERDICT_FILE, check_free_folder
from mhainterp.specialization import (
    SpecializationSettings,
    division_of_labour,
    specialization_test,
)
from mhainterp.specialization.headline import (
    headline_stability_blocks,
    pretrained_headline_stability,
    save_headline_stability,
)
from mhainterp.specialization.needed.dead import PRETRAINED_QUIET_SET
from mhainterp.specialization.verdict.result import SpecializationResult
from mhainterp.specialization.whom.division_result import DivisionResult
from mhainterp.tasks.text import TEXT_N_EVAL, TextTask
from mhainterp.validation import check_int, invalid

__all__ = [
    "MARKER",
    "PretrainedVerdict",
    "headline_sentences",
    "is_pretrained_folder",
    "specialize_pretrained",
    "write_pretrained_report",
]

MARKER = PRETRAINED_VERDICT_FILE
"""The file that makes a folder a pretrained model's verdict (written last)."""

_DIVISION_PREFIX = "division"


@dataclass
class PretrainedVerdict:
    """What :func:`specialize_pretrained` found and wrote.

    Attributes:
        result: The specialization result (labels, roles, needed / backed up / dead).
        division: The division of labour along the text axes.
        sentences: One sentence per question (:func:`headline_sentences`).
        paths: The files written.
    """

    result: SpecializationResult
    division: DivisionResult
    sentences: list[str]
    paths: list[Path]


def _name(model: BridgedModel) -> str:
    p = model.provenance
    return str(p.get("upstream") or p.get("source") or "pretrained").split("/")[-1]


def _heads_list(heads: list[str], limit: int = 6) -> str:
    shown = ", ".join(heads[:limit])
    return shown + (f", ... ({len(heads)} in all)" if len(heads) > limit else "")


def headline_sentences(
    name: str,
    heads: pd.DataFrame,
    index: pd.DataFrame,
    damage: str = "",
    min_index: float | None = None,
) -> list[str]:
    """One sentence per question, from the saved tables only.

    Args:
        name: The model's name.
        heads: The specialization ``heads`` table (``head_label, label, holds, dead, needed,
            backed_up``).
        index: The division's ``index`` table (``by, index, null_high, call, basis``).
        damage: What damage is measured in (the division's ``settings["damage"]``).
        min_index: The division test's effect gate (its ``settings["min_index"]``): an axis
            not divided whose index is above the null's 95% quantile but below this gate is
            said to be so, not as if it were within the null.

    Example:
        >>> heads = pd.DataFrame({"head_label": ["L0H0", "L0H1"], "holds": ["previous", ""],
        ...     "dead": [False, True], "needed": [True, False], "backed_up": [False, False]})
        >>> index = pd.DataFrame({"by": ["position"], "index": [0.01], "null_high": [0.05],
        ...     "call": ["not divided"], "basis": ["single"]})
        >>> where, whom, need = headline_sentences("m", heads, index)
        >>> where[-64:]
        'beyond the random-weight and permutation nulls (previous: L0H0).'
        >>> whom[:80]
        'm, whom they serve: the heads do not divide the work along position (index 0.01 '
        >>> need[:58]
        'm, whether they are needed: 1 needed, 0 backed up, 1 dead '
    """
    total = len(heads)
    holding = heads[heads["holds"].fillna("").astype(str) != ""]
    by_relation: dict[str, list[str]] = {}
    for head, relation in zip(holding["head_label"], holding["holds"], strict=True):
        by_relation.setdefault(str(relation), []).append(str(head))
    relations = "; ".join(
        f"{rel}: {_heads_list(hs)}"
        for rel, hs in sorted(by_relation.items(), key=lambda kv: -len(kv[1]))
    )
    where = (
        f"{name}, where the heads look: {len(holding)} of {total} heads hold a relation beyond "
        f"the random-weight and permutation nulls" + (f" ({relations})." if relations else ".")
    )
    divided = index[index["call"] == "divided"]
    parts = [
        _not_divided(row, min_index) for row in index.itertuples() if row.call == "not divided"
    ]
    calls = dict(zip(index["by"], index["call"], strict=True))
    unsettled = [b for b, c in calls.items() if c not in ("divided", "not divided")]
    if not len(index):
        whom = f"{name}, whom they serve: not measured."
    elif len(divided):
        axes = ", ".join(
            f"{row.by} (index {row.index:.2g} vs same-function null, 95% quantile "
            f"{row.null_high:.2g})"
            for row in divided.itertuples()
        )
        rest = [r for r in index["by"] if r not in set(divided["by"])]
        whom = f"{name}, whom they serve: the heads divide the work along {axes}" + (
            f"; not along {', '.join(rest)}." if rest else "."
        )
    elif parts:
        whom = f"{name}, whom they serve: the heads do not divide the work along " + (
            "; ".join(parts) + "."
        )
    else:
        whom = f"{name}, whom they serve: cannot tell (too few heads do measurable damage)."
    if unsettled and (len(divided) or parts):  # method-dependent, cannot tell: said so
        whom = whom[:-1] + "; " + ", ".join(f"{calls[b]} along {b}" for b in unsettled) + "."
    if damage:
        whom = whom[:-1] + f"; damage is the {damage}."
    needed = int(heads["needed"].astype(bool).sum())
    backed = int(heads["backed_up"].astype(bool).sum())
    dead = int(heads["dead"].astype(bool).sum())
    need = (
        f"{name}, whether they are needed: {needed} needed, {backed} backed up, {dead} dead "
        "(decided by function: removing each head, its group, its write)."
    )
    # More dead heads than the largest quiet set removed together means their set was not
    # removed (dead_heads: then every candidate passes on its single-head test alone)
    if dead > PRETRAINED_QUIET_SET:
        need = (
            f"{name}, whether they are needed: {needed} needed, {backed} backed up, at most "
            f"{dead} dead (each writes almost nothing and costs nothing removed alone; sets of "
            f"more than {PRETRAINED_QUIET_SET} quiet heads are not removed together)."
        )
    return [where, whom, need]


def _not_divided(row: Any, min_index: float | None) -> str:
    """One axis the heads do not divide the work along, with its numbers; where its index is
    beyond the null but below the effect gate, said so (MiniLM by target frequency: 0.014
    against a null quantile of 0.010, below the gate of 0.02).

    Example:
        >>> from types import SimpleNamespace as Row
        >>> beyond = _not_divided(Row(by="position", index=0.0141, null_high=0.0104), 0.02)
        >>> print(beyond[:51]); print(beyond[52:])
        position (index 0.014, above the same-function null
        (95% quantile 0.01) but below the 0.02 effect gate)
        >>> _not_divided(Row(by="token", index=0.01046, null_high=0.01029), 0.02)[:71]
        'token (index 0.0105, above the same-function null (95% quantile 0.0103)'
        >>> _not_divided(Row(by="position", index=0.009, null_high=0.0104), 0.02)
        'position (index 0.009 vs same-function null, 95% quantile 0.01)'
    """
    if min_index is not None and row.null_high < row.index < min_index:
        # as many digits as it takes to see the two apart (0.0105 above 0.0103)
        digits = next((d for d in (2, 3, 4) if f"{row.index:.{d}g}" != f"{row.null_high:.{d}g}"), 4)
        return (
            f"{row.by} (index {row.index:.{digits}g}, above the same-function null (95% quantile "
            f"{row.null_high:.{digits}g}) but below the {min_index:.2g} effect gate)"
        )
    return (
        f"{row.by} (index {row.index:.2g} vs same-function null, 95% quantile {row.null_high:.2g})"
    )


def specialize_pretrained(
    model: BridgedModel | str | os.PathLike[str],
    text: str | os.PathLike[str],
    out: str | os.PathLike[str],
    settings: SpecializationSettings | None = None,
    *,
    by: Any = None,
    n_eval: int = TEXT_N_EVAL,
    bos: bool = True,
    progress: bool = False,
    screen: str = "attribution",
    headline_stability: bool = False,
) -> PretrainedVerdict:
    """The verdict on a pretrained model: :func:`specialization_test` and
    :func:`division_of_labour` on ``n_eval`` sentences of ``text``, saved in ``out``.

    Args:
        model: A loaded model or what :func:`~mhainterp.pretrained.load_pretrained` takes.
        text: ``"stdlib"`` or a UTF-8 text file (one sentence per line).
        out: The folder to write (``analysis/`` tables, ``provenance.json``,
            ``verdict.md``, :data:`MARKER`).
        settings: The specialization settings (its ``n_eval`` is replaced by ``n_eval``).
        by: Division axes (default: the text axes).
        n_eval: Sentences (default :data:`~mhainterp.tasks.text.TEXT_N_EVAL`).
        bos: Keep a decoder's BOS prefix (SmolLM2's ``<|im_start|>``;
            :func:`~mhainterp.tasks.text.text_batch`).
        progress: Progress bars (one over the verdict's stages, with an estimate).
        screen: The division's head screen (``DivisionSettings.screen``): ``"attribution"``
            (the default here: exact profiles only for the heads that matter and a sample of
            the rest, :mod:`~mhainterp.specialization.whom.screen`) or ``"none"``.
        headline_stability: Also re-decide the verdict with every gate moved
            (:func:`~mhainterp.specialization.headline.pretrained_headline_stability`), saved
            as ``analysis/headline_stability.csv`` and ``.json``.

    Each stage (the division, then the specialization test) is saved when it finishes under
    ``out/cache/`` (:func:`~mhainterp.analyze.verdict_cache.stage_cache`, keyed by the model,
    the text, ``n_eval``, ``bos`` and the settings): a run that is interrupted and started
    again continues from the last finished stage.

    Example:
        >>> v = specialize_pretrained("minilm", "stdlib", "runs/minilm", n_eval=8)  # doctest: +SKIP
        >>> print(v.sentences[0])  # doctest: +SKIP
    """
    check_int("n_eval", n_eval, minimum=2)  # one sentence's mean is its own output (below)
    check_free_folder(out, "pretrained verdict", "out")  # before the model loads
    model = model if isinstance(model, BridgedModel) else load_pretrained(model)
    task = TextTask(model, text, n_eval=n_eval, bos=bos)
    if task.n_eval < 2:  # before any work
        raise invalid(
            "text",
            str(text),
            f"a text of at least 2 sentences, one per line (it holds {task.n_eval}: mean "
            "ablation replaces a head's output by its mean over the sentences, which for one "
            "sentence is its own, so every damage would be 0)",
        )
    base = (settings or SpecializationSettings()).to_dict()
    settings = SpecializationSettings.from_dict({**base, "n_eval": task.n_eval})
    division_kwargs = {} if by is None else {"by": by}
    out = Path(out)
    cache = stage_cache(out, model, text, task.n_eval, bos, settings, by, screen)
    stages = tqdm(total=2, desc="verdict stages", disable=not progress, unit="stage")
    division = cache.load("division", DivisionResult.load)
    if division is None:
        division = division_of_labour(
            model, task, settings=settings, progress=progress, screen=screen, **division_kwargs
        )
        cache.save("division", division.save)
    stages.update()
    result = cache.load("specialization", SpecializationResult.load)
    if result is None:
        result = specialization_test(model, task, settings, progress=progress, division=division)
        cache.save("specialization", result.save)
    stages.update()
    stages.close()
    analysis = out / "analysis"
    analysis.mkdir(parents=True, exist_ok=True)
    paths = result.save(analysis)
    paths += division.save(analysis, _DIVISION_PREFIX)
    if headline_stability:
        table = pretrained_headline_stability(
            model, task, result, division, progress=progress, **division_kwargs
        )
        paths += save_headline_stability(analysis, table)
    name = _name(model)
    damage = str(division.settings.get("damage", ""))
    gate = division.settings.get("min_index")
    sentences = headline_sentences(name, result.heads, division.index, damage, gate)
    batch = task.eval_batch()
    provenance = {
        **model.provenance,
        "architecture": model.cfg.architecture,
        "objective": model.cfg.objective,
        "text": str(text),
        "n_sentences": task.n_eval,
        "n_tokens": int(batch.padding_mask.sum()),
        "bos_prefix": bos,
        "damage": damage,
        "name": name,
    }
    paths.append(write_json(out / "provenance.json", provenance))
    verdict_md = "\n\n".join(sentences) + "\n\n" + result.to_markdown()
    (out / "verdict.md").write_text(verdict_md, encoding="utf-8")
    paths.append(out / "verdict.md")
    paths.append(write_json(out / MARKER, {"sentences": sentences, "name": name}))
    return PretrainedVerdict(result, division, sentences, paths)


def is_pretrained_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a pretrained model's verdict (:func:`specialize_pretrained`)."""
    return (Path(path) / MARKER).is_file()


def write_pretrained_report(
    path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> tuple[Path, Path]:
    """``report.md`` and ``report.html`` of a pretrained model's verdict, from the saved files:
    one sentence per question first, then the evidence (division index, per-head findings,
    role scores)."""
    path = Path(path)
    out_dir = Path(out) if out is not None else path
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = json.loads((path / MARKER).read_text(encoding="utf-8"))
    provenance = json.loads((path / "provenance.json").read_text(encoding="utf-8"))
    analysis = path / "analysis"
    heads = pd.read_csv(analysis / "specialization_heads.csv", keep_default_na=False)
    index = pd.read_csv(analysis / f"{_DIVISION_PREFIX}_index.csv")
    division_heads = pd.read_csv(analysis / f"{_DIVISION_PREFIX}_heads.csv")
    if "evidence" in division_heads.columns:  # the attribution screen: each head's basis
        evidence = division_heads.drop_duplicates("head_label").set_index("head_label")
        heads["evidence"] = heads["head_label"].map(evidence["evidence"])
    division_meta = json.loads((analysis / f"{_DIVISION_PREFIX}.json").read_text("utf-8"))
    screened = division_meta.get("settings", {}).get("screen_summary")
    title = f"mhainterp report: {meta['name']}"
    columns = ["head_label", "evidence", "finding", "label", "holds", "needed", "backed_up"]
    columns += ["dead"]
    columns += ["top_role", "top_effect", "total_damage", "output_ratio"]
    index_columns = ["by", "call", "index", "ci_low", "ci_high", "null_index", "null_high"]
    index_columns += ["p", "basis", "n_damaging", "reason"]
    blocks = [
        Heading(title, 1),
        Heading("Findings", 2),
        Bullets(list(meta["sentences"])),
        Paragraph(
            f"Weights: {provenance.get('quantisation')} ({provenance.get('source')}); "
            f"{provenance.get('n_sentences')} sentences of {provenance.get('text')}, "
            f"{provenance.get('n_tokens')} tokens. Damage: {provenance.get('damage')}."
        ),
        *_screen_paragraph(screened),
        Heading("Whom the heads serve: division index per text axis", 2),
        Table(index.reindex(columns=[c for c in index_columns if c in index.columns])),
        *headline_stability_blocks(analysis),
        Heading("Every head", 2),
        Table(heads.reindex(columns=[c for c in columns if c in heads.columns])),
    ]
    md = out_dir / "report.md"
    md.write_text(render_markdown(blocks, out_dir), encoding="utf-8")
    html_path = out_dir / "report.html"
    html_path.write_text(render_html(blocks, title), encoding="utf-8")
    return md, html_path


def _screen_paragraph(screened: dict | None) -> list[Paragraph]:
    """What the division's head screen did, for the report (nothing without a screen)."""
    if not screened:
        return []
    t = screened["threshold"]
    checked = screened.get("negative_check", {})
    made_exact = sum(why == "check" for why in screened["exact_because"].values())
    check = (
        f" {len(checked)} heads had an estimate of -{t:g} or below, too far from zero to vouch "
        f"for its sign: each was run exactly, and {made_exact} that cost {t:g} or more are "
        "exact."
        if checked
        else ""
    )
    return [
        Paragraph(
            f"Division profiles: {screened['n_exact']} heads computed exactly (estimated damage "
            f"at least {t:g}, a large negative estimate that the exact run contradicts, a layer "
            f"the estimate misses, or a random sample), {screened['n_screened']} "
            "attribution-screened (their estimate is below that threshold, half the damage "
            "gate; their profiles are estimates); the `evidence` column says which." + check
        )
    ]
