"""Known answer: a division along one axis shows along every axis that goes with it in the data.

Two heads split the query *positions* (2-6 and 7-11) and read nothing else. On unbiased data
only position is divided. When early positions draw small tokens more often (as in ``sort``,
where position and target class go together), the same weights also look divided by token and
by target class. Those two only restate the position split: the index the position profiles
give them through the data alone reaches their own interval, and the verdict says so.
"""

from __future__ import annotations

import pytest
import torch

from mhainterp import division_of_labour
from mhainterp.model.handbuilt import split_heads_model
from mhainterp.specialization.verdict.sentences import RunVerdict
from mhainterp.specialization.whom.division_calls import restated_axis
from mhainterp.specialization.whom.profiles import value_given
from mhainterp.tasks import Batch, split_batch

N, T = 256, 12
SETTINGS = {"n_bootstrap": 50}


def _biased(share: float) -> Batch:
    """``split_batch`` whose token at t (the target at t + 1) is, with probability ``share``,
    drawn from 0-3 at positions 1-5 and from 4-8 later."""
    batch = split_batch(N, seq_len=T)
    generator = torch.Generator().manual_seed(1)
    tokens = batch.tokens.clone()
    for t in range(1, T):
        low, high = (0, 4) if t <= 5 else (4, 9)
        preferred = torch.randint(low, high, (N,), generator=generator)
        tokens[:, t] = torch.where(
            torch.rand(N, generator=generator) < share, preferred, tokens[:, t]
        )
    targets = torch.full_like(batch.targets, -100)
    targets[:, 2:] = tokens[:, 1:-1]
    return Batch(tokens, targets, batch.mask, torch.ones_like(batch.mask))


@pytest.fixture(scope="module")
def model():
    return split_heads_model([("position", [2, 3, 4, 5, 6]), ("position", [7, 8, 9, 10, 11])])


def _restated(result) -> dict[str, str]:
    return {row["by"]: restated_axis(row) for row in result.index.to_dict("records")}


def test_unbiased_data_divide_along_position_alone(model):
    result = division_of_labour(model, _biased(0.0), **SETTINGS)
    calls = result.index.set_index("by")["call"].to_dict()
    assert calls == {"token": "not divided", "position": "divided", "target_class": "not divided"}
    assert _restated(result) == {"token": "", "position": "", "target_class": ""}
    assert result.index.set_index("by").loc["target_class", "index_explained"] < 0.01


def test_axes_that_go_with_position_restate_its_division(model):
    result = division_of_labour(model, _biased(0.6), **SETTINGS)
    index = result.index.set_index("by")
    assert (index["call"] == "divided").all()  # each index alone is beyond its null
    assert _restated(result) == {"token": "position", "position": "", "target_class": "position"}
    # the position split is not what target classes give through the data: far below it
    assert index.loc["position", "index_explained"] < 0.5 * index.loc["position", "ci_low"]
    assert "target_class 0.49 [0.45, 0.53] vs null 0.09 (single): divided (may only restate " in (
        result.summary_line()
    )
    rows = result.index.to_dict("records")
    run = RunVerdict(run="r", task="split", n_heads=2, n_layers=1, seed=0, division=rows)
    assert "the heads divide the work along position (token, target_class follow it in " in (
        run.headline
    )
    assert "so this may only restate the division by position" in run.text


def test_value_given_is_the_share_of_each_value_given_another():
    position = torch.tensor([0, 0, 0, 1, 1])
    klass = torch.tensor([0, 0, 1, 1, 1])
    given = value_given([position, klass], [2, 2], torch.ones(2, 2, dtype=torch.bool))
    assert given[0, 1].tolist() == [[2 / 3, 1 / 3], [0.0, 1.0]]  # class given position
    assert given[1, 0].tolist() == [[1.0, 0.0], [1 / 3, 2 / 3]]  # position given class
    assert given[0, 0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    # a value kept out of an axis (too few triples) takes no share
    keep = torch.tensor([[True, True], [True, False]])
    assert value_given([position, klass], [2, 2], keep)[0, 1].tolist() == [[1.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("method", ["mean", "zero"])
def test_noisy_copies_of_one_head_restate_nothing_and_harm_nothing(method):
    """Two noisy copies of one head that does the whole job, on the position-biased data: the
    heads are backed up and do the same job, so no axis is divided, none is restated
    (``explained_by`` names only a divided axis) and no head helps when removed, under mean
    and zero ablation alike."""
    model = split_heads_model([("all", None), ("all", None)])
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        W_O = model.blocks[0].attn.W_O
        W_O.mul_(0.5).add_(0.05 * torch.randn(W_O.shape, generator=generator) * W_O.abs().max())
    result = division_of_labour(model, _biased(0.6), method=method, methods=(method,), **SETTINGS)
    index = result.index.set_index("by")
    assert (index["call"] != "divided").all(), index["call"].to_dict()
    assert (index["explained_by"] == "").all() and index["index_explained"].isna().all()
    assert _restated(result) == {"token": "", "position": "", "target_class": ""}
    assert (result.heads["helped_share"].fillna(0.0) < 0.5).all()
