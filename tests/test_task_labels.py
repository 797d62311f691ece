"""Every built-in task's labelling is vectorised (issue 39 item 3) and gives bit-identical
tokens, targets, masks and relations to the per-position loops it replaced, kept here as the
oracle."""

from __future__ import annotations

import pytest
import torch

from mhainterp.fast.stacked import sample_many
from mhainterp.tasks import builtin, get_task
from mhainterp.tasks.builtin import BUILTIN_TASKS, InductionTask


def _count_previous_loop(tokens: torch.Tensor) -> torch.Tensor:
    """The loop ``count_previous`` labelled with before (one slice, compare and sum per t)."""
    counts = torch.zeros_like(tokens)
    for t in range(1, tokens.shape[1]):
        counts[:, t] = (tokens[:, :t] == tokens[:, t : t + 1]).sum(-1)
    return counts


def _block_length_loop(task: InductionTask, tokens: torch.Tensor) -> torch.Tensor:
    """The loop over block lengths ``induction`` read ``B`` with before."""
    T = tokens.shape[-1]
    found = torch.zeros(tokens.shape[0], dtype=torch.int64, device=tokens.device)
    for B in task.block_lengths:
        equal = (tokens[:, T - B :] == tokens[:, T - 2 * B : T - B]).all(dim=-1)
        found = torch.where(equal, torch.full_like(found, B), found)
    return found


@pytest.fixture
def oracle(monkeypatch):
    """Within the block the tasks label with the old loops."""

    def use_loops():
        monkeypatch.setattr(builtin, "_count_previous", _count_previous_loop)
        monkeypatch.setattr(InductionTask, "block_length_of", _block_length_loop)

    return use_loops


# (seq_len, d_vocab, min_len): short and long, few and many token values, padded or not
SHAPES = [(5, 3, None), (8, 10, None), (16, 10, None), (16, 4, 6), (24, 12, 13)]
NAMES = [cls.name for cls in BUILTIN_TASKS]


def _task(name: str, seq_len: int, d_vocab: int, min_len: int | None):
    if name == "induction":  # fixed length, enough values for two distinct blocks
        return get_task(name, seq_len=seq_len, d_vocab=max(d_vocab, (seq_len + 1) // 2))
    return get_task(name, seq_len=seq_len, d_vocab=d_vocab, min_len=min_len)


def _labels(task, seeds, n):
    out = []
    for seed in seeds:
        batch = task.sample(n, torch.Generator().manual_seed(seed))
        relations = task.relations(batch.tokens, batch.padding_mask)
        out.append((batch, relations))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}_V{}_min{}".format(*s))
def test_vectorised_labels_equal_the_loops_bit_for_bit(name, shape, oracle):
    task = _task(name, *shape)
    seeds, n = (0, 1, 7), 33
    new = _labels(task, seeds, n)
    batched = sample_many(task, n, [torch.Generator().manual_seed(s) for s in seeds])
    unchecked = sample_many(
        task, n, [torch.Generator().manual_seed(s) for s in seeds], checked=False
    )
    oracle()
    old = _labels(task, seeds, n)
    for (b_new, r_new), (b_old, r_old) in zip(new, old, strict=True):
        for field in ("tokens", "targets", "mask", "padding_mask"):
            a, b = getattr(b_new, field), getattr(b_old, field)
            assert a.dtype == b.dtype and torch.equal(a, b), field
        assert r_new.keys() == r_old.keys()
        for key in r_new:
            assert r_new[key].dtype == r_old[key].dtype and torch.equal(r_new[key], r_old[key])
    # the stacked trainer's labelling (checked and unchecked) is the same batch
    for many in (batched, unchecked):
        for m, (b_old, _) in enumerate(old):
            assert torch.equal(many.targets[m], b_old.targets)
            assert torch.equal(many.mask[m], b_old.mask)


def test_count_previous_on_hand_made_tokens_and_odd_dtypes():
    tokens = torch.tensor([[3, 1, 3, 3, 1], [0, 0, 0, 0, 0], [4, 3, 2, 1, 0]])
    expected = [[0, 0, 1, 2, 1], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    assert builtin._count_previous(tokens).tolist() == expected
    for dtype in (torch.int32, torch.int64):
        got = builtin._count_previous(tokens.to(dtype))
        assert got.dtype == dtype and torch.equal(got, _count_previous_loop(tokens.to(dtype)))
    empty = torch.zeros(0, 5, dtype=torch.long)
    assert builtin._count_previous(empty).shape == (0, 5)


def test_block_length_reads_every_b_and_zero_when_none_fits():
    task = InductionTask(seq_len=9, d_vocab=6, min_block=2)
    tokens = torch.tensor(
        [
            [5, 5, 5, 5, 5, 1, 2, 1, 2],  # B = 2
            [5, 5, 5, 1, 2, 3, 1, 2, 3],  # B = 3
            [5, 1, 2, 3, 4, 1, 2, 3, 4],  # B = 4
            [0, 1, 2, 3, 4, 5, 0, 1, 2],  # none
            [1, 1, 1, 1, 1, 1, 1, 1, 1],  # every B fits: the largest wins
        ]
    )
    assert task.block_length_of(tokens).tolist() == [2, 3, 4, 0, 4]
    assert torch.equal(task.block_length_of(tokens), _block_length_loop(task, tokens))
