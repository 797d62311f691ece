"""Bad arguments raise ParameterError in the one format ("name=value is invalid: allowed" or,
for a tensor or table, "name is invalid: allowed, got what it was"), one case per check that
used to raise a plain ValueError in its own wording (issue 17 item 3).

Each case builds the smallest bad call on a hand-built model and asserts the exact message.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from mhainterp.ablation import ablate, pairwise_ablation
from mhainterp.capture import average_relations, example_patterns, patterns_frame
from mhainterp.capture.core import capture_activations
from mhainterp.capture.statistics import offset_profile
from mhainterp.cli import main
from mhainterp.data import as_batch, batch_for_model
from mhainterp.explore.session import ExploreSession
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.runs import check_dtype_name
from mhainterp.scoring import Totals
from mhainterp.tasks import Batch, get_task
from mhainterp.validation import ParameterError

TASK = get_task("previous_token", seq_len=8, d_vocab=10)


@pytest.fixture(scope="module")
def model():
    """Two hand-built heads (previous token, uniform) on sequences of 8 tokens from 10."""
    return handbuilt_model(["previous", "uniform"], seq_len=8)


def _raises(call, message: str) -> None:
    """``call()`` raises ParameterError with exactly ``message``."""
    with pytest.raises(ParameterError, match=f"^{re.escape(message)}$"):
        call()


def test_ablation_reference_errors(model):
    tokens = torch.arange(8).repeat(2, 1)

    def run_ablated(reference):
        with ablate(model, ["L0H0"], "mean", reference=reference) as ablated:
            ablated(tokens)

    _raises(
        lambda: run_ablated(None),
        "reference=None is invalid: a Task, Batch or tokens whose clean activations give the "
        "replacement (method='mean' needs reference=; method='zero' needs none)",
    )
    _raises(
        lambda: run_ablated(tokens[:, :4]),
        "reference is invalid: a batch at least as long as the ablated one (8 positions), "
        "got 4 positions",
    )
    padding = torch.zeros(2, 8, dtype=torch.bool)
    _raises(
        lambda: run_ablated(as_batch(tokens, padding_mask=padding)),
        "reference is invalid: a batch with real tokens, got padding only",
    )


def test_pairs_must_name_two_different_heads(model):
    _raises(
        lambda: pairwise_ablation(model, TASK, pairs=[("L0H1", "L0H1")], n_eval=4),
        "pairs=['L0H1'] is invalid: two different heads each",
    )


def test_capture_errors(model):
    tokens = torch.arange(8).repeat(2, 1)
    _raises(
        lambda: capture_activations(model, tokens, None, ["blocks.0.hook_nope"]),
        "names=['blocks.0.hook_nope'] is invalid: hook names of the model, e.g. "
        "'blocks.0.attn.hook_pattern'",
    )
    _raises(
        lambda: example_patterns(model, tokens, index=2),
        "index=2 is invalid: an integer in [-2, 2): the data has 2 sequences",
    )
    _raises(
        lambda: average_relations({"mine": torch.zeros(8, 8)}, tokens),
        "relations['mine'] is invalid: a [n, q, k] tensor aligned with the data's sequences, "
        "got torch.Size([8, 8])",
    )
    _raises(
        lambda: average_relations({"mine": torch.zeros(2, 4, 4)}, tokens),
        "relations['mine'] is invalid: [batch, q, k] = (2, 8, 8) for this batch (one template "
        "per sequence of the data), got (2, 4, 4)",
    )
    _raises(
        lambda: patterns_frame(torch.zeros(2, 8)),
        "average is invalid: a [layer, head, q, k] tensor (from average_patterns), "
        "got torch.Size([2, 8])",
    )
    _raises(
        lambda: offset_profile(pd.DataFrame({"layer": [0], "head": [0]})),
        "statistics is invalid: the table from head_statistics, but it is missing columns "
        "['head_label', 'metric', 'value']",
    )


def test_batch_that_does_not_fit_the_model(model):
    two_targets = get_task("multi_relation", seq_len=8, d_vocab=10).sample(2, torch.Generator())
    _raises(
        lambda: batch_for_model(model, two_targets),
        "data is invalid: a batch of the model's task, with n_targets=1 target(s) per "
        f"position, got {two_targets.n_targets}",
    )
    batch = TASK.sample(2, torch.Generator().manual_seed(0))
    targets = batch.targets.clone()
    targets[0, 1] = 50
    high = Batch(batch.tokens, targets, batch.mask, batch.padding_mask)
    _raises(
        lambda: batch_for_model(model, high),
        "data is invalid: a batch of the model's task, with target classes below "
        f"d_vocab_out={model.cfg.d_vocab_out}, got class 50",
    )
    _raises(
        lambda: batch_for_model(model, as_batch(torch.arange(8)[None])),
        "data is invalid: a batch with at least one scored position, got none "
        "(its mask is all False)",
    )


def test_scoring_needs_a_scored_position():
    # (mean_loss's own checks live with it in mhainterp/model/loss.py and its tests)
    empty = Totals(torch.zeros(1, dtype=torch.float64), torch.zeros(1, 1), torch.zeros(1))
    _raises(
        empty.metrics,
        "mask is invalid: at least one scored position, got none (it is all False)",
    )


def test_explorer_example_index(model):
    session = ExploreSession(model, TASK, n_eval=4)
    _raises(lambda: session.example(4), "index=4 is invalid: an integer in [0, 4)")
    _raises(lambda: session.example(True), "index=True is invalid: an integer in [0, 4)")


def test_saved_dtype_name():
    _raises(
        lambda: check_dtype_name("int8"),
        "model.dtype='int8' is invalid: one of 'float32', 'float64', 'float16', 'bfloat16'",
    )


def test_train_into_a_folder_of_another_run(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["train", "--task", "reverse", "--task-param", "seq_len=6", "--task-param",
            "d_vocab=4", "--d-model", "8", "--n-heads", "2", "--steps", "2", "--batch-size", "4",
            "--warmup-steps", "1", "--n-eval", "8", "--quiet", "--out", out]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"mhainterp train: error: --out={out!r} is invalid: a folder free for this run, but it "
        "already holds another run ("
    ), err
    assert err.endswith("to replace it, add --overwrite"), err


def test_a_long_path_is_named_with_its_file_and_a_huge_value_stays_one_short_line():
    """A value is shortened in the middle, never at the end: a path's end is the file's name
    (cut at the end, "text='/tmp/.../dot..." named no file); a list stays under 80 characters."""
    from mhainterp.validation import invalid

    path = "/tmp/" + "d" * 300 + "/my_notes.txt"
    message = str(invalid("text", path, "a text file"))
    assert message.startswith("text='/tmp/dd") and "/my_notes.txt' is invalid" in message
    assert message.count("...") == 1 and len(message) < 240
    assert f"text='{path[:120]}' is invalid" in str(invalid("text", path[:120], "x"))  # whole
    huge = str(invalid("tokens", list(range(10_000)), "a short list"))
    assert len(huge.split(" is invalid")[0]) <= len("tokens=") + 80 and "..." in huge
