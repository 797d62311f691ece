"""Known answer: a head that costs accuracy is reported as harmful, never as a harmless spare.

``split_heads_model``'s L0H0 copies the previous token (the whole job). L0H1 attends the same
way but writes the *wrong* class (v + 1) at twice the strength when the copied token v is in
0..3, so the clean model is right only on the other tokens: removing L0H1 raises the accuracy
from about 0.54 to 1. The clipped ``total_damage`` is 0 for it; the signed evidence is not.
"""

from __future__ import annotations

import pytest
import torch

from mhainterp.model.handbuilt import split_heads_model
from mhainterp.specialization import division_of_labour, specialization_test
from mhainterp.tasks import Task, split_batch
from mhainterp.tasks.templates import previous_token_template

T, V = 12, 10
HURT = (0, 1, 2, 3)
FAST = {"method": "mean", "n_bootstrap": 50}


class SplitDataTask(Task):
    """``split_batch``'s data as a task: BOS ``V - 1`` at 0, target ``tokens[t - 1]`` from 2."""

    name = "split_data"
    causal = True

    @property
    def d_vocab_out(self):
        return self.d_vocab

    def sample_tokens(self, n, lengths, generator):
        tokens = torch.randint(0, self.d_vocab - 1, (n, self.seq_len), generator=generator)
        tokens[:, 0] = self.d_vocab - 1
        return tokens

    def compute_targets(self, tokens, padding_mask):
        targets = torch.zeros_like(tokens)
        targets[:, 1:] = tokens[:, :-1]
        scored = padding_mask.clone()
        scored[:, :2] = False
        return targets, scored

    def compute_relations(self, tokens, padding_mask):
        return {"previous": previous_token_template(tokens, padding_mask)}


def _harmful_model():
    model = split_heads_model([("all", None), ("target", list(HURT))], seq_len=T, d_vocab=V)
    copy = V + T  # where split_heads_model's readout dimensions start (tokens, positions, copy)
    with torch.no_grad():
        wrong = torch.zeros_like(model.blocks[0].attn.W_O[1])
        for v in HURT:
            wrong[v, copy + v + 1] = 2.0  # outvotes L0H0's copy of v with class v + 1
        model.blocks[0].attn.W_O[1] = wrong
    return model


def test_a_head_whose_removal_raises_the_accuracy_is_harmful():
    result = specialization_test(_harmful_model(), SplitDataTask(seq_len=T, d_vocab=V), n_eval=256)
    heads = result.heads.set_index("head_label")
    # the share of scored queries whose copied token is in 0..3: 4 of 9 tokens
    assert heads.loc["L0H1", "removal_gain"] == pytest.approx(4 / 9, abs=0.06)
    assert bool(heads.loc["L0H1", "harmful"]) and not bool(heads.loc["L0H1", "needed"])
    assert heads.loc["L0H1", "total_damage"] == 0.0  # clipped: the reason for the column
    gain = heads.loc["L0H1", "removal_gain"]
    assert heads.loc["L0H1", "finding"].endswith(
        f"harmful: removing it improves a target by {gain:.2f}"
    )
    # the head that does the job is needed and harms nothing
    assert bool(heads.loc["L0H0", "needed"]) and not bool(heads.loc["L0H0", "harmful"])
    assert heads.loc["L0H0", "removal_gain"] == 0.0
    assert (
        f"1 harmful: removing one alone improves a target by ≥ 0.01 accuracy (L0H1 {gain:.2f})"
        in (result.verdict.text)
    )


def test_the_division_table_shows_the_harm_the_selectivity_clips():
    """L0H1's profile is negative on every value (its removal only helps): not defined for the
    selectivity, and its ``helped_share`` is 1 where it used to be NaN for exactly this head."""
    result = division_of_labour(_harmful_model(), split_batch(256, seq_len=T, d_vocab=V), **FAST)
    rows = result.heads.set_index(["head_label", "by"])
    assert rows.loc[("L0H1", "token"), "helped_share"] == 1.0
    assert rows.loc[("L0H0", "token"), "helped_share"] == 0.0
