"""Gradient importance and the pruning curve score cross-entropy against the targets; an
embedding model's targets are placeholders (0), so on MiniLM they returned numbers that
measure nothing. They now refuse such a model in one line, as ``attribution_patching`` does
(audit item 8). Also: ``specialize --help``'s screen sample share is the setting's (item 12).

The embedding model is a tiny randomly initialised BERT saved to a temporary folder, as in
``tests/test_pretrained.py`` (no download).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on the Hub

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mhainterp import cli  # noqa: E402
from mhainterp.attribution import (  # noqa: E402
    attribution_patching,
    gradient_importance,
    prune_curve,
)
from mhainterp.pretrained import load_pretrained  # noqa: E402
from mhainterp.tasks.text import text_batch  # noqa: E402
from mhainterp.validation import ParameterError  # noqa: E402

V = 40  # tiny vocabulary


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A BridgedModel of a random 2-layer x 4-head BERT: bidirectional, embedding objective."""
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("bert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]
    (folder / "vocab.txt").write_text("\n".join(words))
    cfg = transformers.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(folder)
    transformers.BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    model = load_pretrained(folder)
    assert model.cfg.objective == "embedding"
    return model


@pytest.fixture(scope="module")
def batch(bert):
    return text_batch(bert, ["w5 w6 w7 w8", "w9 w10 w11", "w12 w13 w14 w15 w16"])


@pytest.mark.parametrize(
    ("function", "instead"),
    [
        (gradient_importance, "head_importance"),
        (prune_curve, "evaluate_head_sets"),
        (attribution_patching, "evaluate_head_sets"),  # the refusal the others follow
    ],
)
def test_cross_entropy_attributions_refuse_an_embedding_model_in_one_line(
    bert, batch, function, instead
):
    with pytest.raises(ParameterError) as refused:
        function(bert, batch)
    message = str(refused.value)
    assert message.startswith("model=") and "a next-token model (" in message
    assert instead in message and "\n" not in message


def test_specialize_help_states_the_default_screen_sample_share(capsys):
    from mhainterp.cli.specialize import SCREEN_SAMPLE
    from mhainterp.specialization.settings import DivisionSettings

    assert DivisionSettings().screen_sample == SCREEN_SAMPLE  # the mirror equals its home
    with pytest.raises(SystemExit):
        cli.main(["specialize", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"and a {DivisionSettings().screen_sample:.0%} sample" in help_text
    assert "10% sample" not in help_text
