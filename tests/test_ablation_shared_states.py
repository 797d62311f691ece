"""The ablation engine's shortcuts change no value, bit for bit: configurations that ablate the
same heads above the last layer share that layer's state (within a pass, and across passes of
one replacement through a CleanCache), and a chunk without padding runs without a padding mask.
Each shortcut is checked to be taken, and its results equal to the whole forward's."""

from __future__ import annotations

import pytest
import torch

from mhainterp.ablation import engine, evaluate_head_sets, plan
from mhainterp.ablation.engine import head_masks, run_masks
from mhainterp.ablation.replacement import FULL_FORWARD_ROWS, CleanCache, build_replacement
from mhainterp.tasks import get_task
from mhainterp.training import build_model

N = FULL_FORWARD_ROWS  # a batch that fills a forward: every configuration runs alone in it

SETS = [
    [],
    [(0, 1)],
    [(0, 1), (2, 0)],
    [(0, 1), (2, 3)],
    [(0, 1), (1, 2)],
    [(0, 1), (1, 2), (2, 0)],
    [(1, 0), (2, 1)],
    [(1, 0)],
    [(1, 0), (2, 1), (2, 2)],
    [(2, 2)],
]
"""Configurations of a 3-layer model: sharers above the last layer (L0H1 with and without
last-layer heads, L0H1 + L1H2, L1H0) and ones alone (the clean model, L2H2)."""


@pytest.fixture(scope="module")
def padded_task():
    return get_task("multi_relation", seq_len=8, d_vocab=5, min_len=5)


@pytest.fixture(scope="module")
def model(padded_task):
    return build_model(padded_task, d_model=32, n_heads=4, n_layers=3, seed=1)


@pytest.fixture(scope="module")
def padded(padded_task):
    batch = padded_task.eval_batch(N)
    assert not bool(batch.padding_mask.all())
    return batch


def _counted(monkeypatch, name: str) -> list:
    calls: list = []
    original = getattr(engine, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, name, counted)
    return calls


def _alone(model, batch, method):
    """Each configuration in a pass of its own: its whole forward, no state shared."""
    return [evaluate_head_sets(model, batch, [s], method, per_position=True) for s in SETS]


def _assert_equal(result, alone) -> None:
    for c, single in enumerate(alone):
        assert torch.equal(result.totals.loss_sum[c : c + 1], single.totals.loss_sum), SETS[c]
        assert torch.equal(result.totals.correct[c : c + 1], single.totals.correct), SETS[c]
        assert torch.equal(result.scores.nll[c : c + 1], single.scores.nll), SETS[c]


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_configurations_alike_above_the_last_layer_share_its_state_bit_for_bit(
    model, padded, method, monkeypatch
):
    alone = _alone(model, padded, method)
    states = _counted(monkeypatch, "_state_at")
    finishes = _counted(monkeypatch, "_finish_copies")
    result = evaluate_head_sets(model, padded, SETS, method, per_position=True)
    # 8 sharers in 3 groups (L0H1: 3; L0H1 + L1H2: 2; L1H0: 3): one state per group and
    # sequence chunk, then each sharer's last layer
    chunks = -(-len(padded) // FULL_FORWARD_ROWS)
    assert (len(states), len(finishes)) == (3 * chunks, 8 * chunks)
    _assert_equal(result, alone)


def test_a_pass_without_sharers_runs_whole_forwards(model, padded, monkeypatch):
    finishes = _counted(monkeypatch, "_finish_copies")
    evaluate_head_sets(model, padded, [[(0, 1)], [(0, 2), (2, 0)], [(1, 3)]], "mean")
    assert finishes == []


def test_a_cache_keeps_the_states_for_the_next_pass_of_the_replacement(model, padded, monkeypatch):
    """A pruning step: the next pass adds one last-layer head to the last pass's heads; it
    starts from the state the first pass left in the cache, and scores as without it."""
    replacement = build_replacement(model, "mean", padded)
    first, second = head_masks(model, [[(0, 1)]]), head_masks(model, [[(0, 1), (2, 0)]])
    expected, _ = run_masks(model, padded, second, replacement)  # no cache: the whole forward
    cache = CleanCache()
    run_masks(model, padded, first, replacement, cache=cache)
    assert len(cache.last_layer_states) == -(-len(padded) // FULL_FORWARD_ROWS)
    states = _counted(monkeypatch, "_state_at")
    got, _ = run_masks(model, padded, second, replacement, cache=cache)
    assert states == []  # every chunk's state came from the cache
    assert torch.equal(got.loss_sum, expected.loss_sum)
    assert torch.equal(got.correct, expected.correct)
    # another replacement (another method, or another draw) never takes them
    other = build_replacement(model, "zero", None)
    run_masks(model, padded, second, other, cache=cache)
    assert len(states) == -(-len(padded) // FULL_FORWARD_ROWS)


def test_kept_states_stay_within_their_budget_the_newest_always_kept(monkeypatch):
    monkeypatch.setattr(engine, "LAST_LAYER_STATE_BYTES", 100)
    states: dict = {}
    state = (torch.zeros(10), torch.zeros(5))  # 60 bytes
    engine._keep_state(states, "a", None, state)
    engine._keep_state(states, "b", None, state)
    assert list(states) == ["b"]  # 120 bytes: the oldest out
    big = (torch.zeros(100), torch.zeros(1))
    engine._keep_state(states, "c", None, big)
    assert list(states) == ["c"]  # over the budget alone, but the newest


def test_a_chunk_without_padding_runs_without_a_mask_to_the_same_values(monkeypatch):
    task = get_task("multi_relation", seq_len=8, d_vocab=5)  # no padding
    model = build_model(task, d_model=32, n_heads=4, n_layers=2, seed=2)
    batch = task.eval_batch(64)
    assert bool(batch.padding_mask.all())
    sets = [[(0, 0)], [(0, 1), (1, 2)], [(1, 3)]]
    masked = []
    original = model.logits_from_z

    def spy(layer, resid_pre, z, padding_mask=None):
        if layer == 0:  # the copies' forwards (the last layer's readout checks its ties)
            masked.append(padding_mask is not None)
        return original(layer, resid_pre, z, padding_mask)

    monkeypatch.setattr(model, "logits_from_z", spy)
    unmasked = evaluate_head_sets(model, batch, sets, "mean", per_position=True)
    assert masked and not any(masked)
    monkeypatch.setattr(engine, "unpadded_chunks", lambda m, cuts, real: dict.fromkeys(cuts, False))
    masked.clear()
    with_mask = evaluate_head_sets(model, batch, sets, "mean", per_position=True)
    assert masked and all(masked)
    assert torch.equal(unmasked.totals.loss_sum, with_mask.totals.loss_sum)
    assert torch.equal(unmasked.scores.nll, with_mask.scores.nll)


def test_padded_chunks_keep_their_mask(model, padded):
    cuts = {(0, 2): 8, (2, 4): 8}
    assert plan.unpadded_chunks(model, cuts, [8, 8, 8, 5]) == {(0, 2): True, (2, 4): False}


def test_values_keys_are_equal_only_where_the_values_are(model, padded):
    """Two mean replacements of one CleanCache share their means (one key), those of two
    caches do not; zero is zero everywhere; each resample draw is its own."""
    cache, other = CleanCache(), CleanCache()
    mean = [build_replacement(model, "mean", padded, cache=c) for c in (cache, cache, other)]
    assert mean[0].values_key() == mean[1].values_key() != mean[2].values_key()
    zero = [build_replacement(model, "zero", None) for _ in range(2)]
    assert zero[0].values_key() == zero[1].values_key() != mean[0].values_key()
    resample = [build_replacement(model, "resample", padded, cache=cache) for _ in range(2)]
    assert resample[0].values_key() != resample[1].values_key()


def test_a_later_pass_of_the_same_values_starts_from_the_kept_state(model, padded, monkeypatch):
    """The importance table's single layer-0 heads leave their states; the pairwise table's
    pairs of such a head with a last-layer head (another pass, another replacement of the
    same means) start there, and score as their whole forwards."""
    cache = CleanCache()
    evaluate_head_sets(model, padded, [[(0, 1)], [(0, 2)]], "mean", cache=cache)
    states = _counted(monkeypatch, "_state_at")
    sets = [[(0, 1), (2, 0)], [(0, 2), (2, 3)]]
    got = evaluate_head_sets(model, padded, sets, "mean", cache=cache)
    assert states == []
    for c, heads in enumerate(sets):
        alone = evaluate_head_sets(model, padded, [heads], "mean")
        assert torch.equal(got.totals.loss_sum[c : c + 1], alone.totals.loss_sum), heads
