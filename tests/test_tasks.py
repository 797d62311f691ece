"""Tests for mhainterp.tasks: hand-computed tables of targets and relation templates, sampling,
padding, the fixed evaluation set, the registry and its error messages."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor

from mhainterp.tasks import (
    BUILTIN_TASKS,
    IGNORE_INDEX,
    RELATION_TEMPLATES,
    Batch,
    CountPreviousTask,
    InductionTask,
    InvalidTaskError,
    ReverseTask,
    Task,
    accepted_params,
    first_position_template,
    get_task,
    induction_template,
    list_tasks,
    mirror_template,
    previous_token_template,
    register_task,
    same_token_template,
    self_template,
    sort_source_template,
    uniform_template,
    unregister_task,
)

X = IGNORE_INDEX  # -100, unscored
BUILTIN_NAMES = [
    "count_previous",
    "histogram",
    "induction",
    "multi_relation",
    "previous_token",
    "reverse",
    "sort",
]
VARIABLE_LENGTH_NAMES = [n for n in BUILTIN_NAMES if n != "induction"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_batches_equal(a: Batch, b: Batch) -> None:
    for name in ("tokens", "targets", "mask", "padding_mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name


# --------------------------------------------------------------------------- hand-computed targets

# (task, params, tokens, expected targets, expected mask). Padded tasks infer the padding from
# pad_token = d_vocab. Every value below was worked out by hand.
TARGET_CASES = [
    # count_previous: earlier copies of the token at t
    ("count_previous", dict(seq_len=5, d_vocab=4), [3, 1, 3, 3, 1], [0, 0, 1, 2, 1], [1] * 5),
    ("count_previous", dict(seq_len=5, d_vocab=4), [0, 0, 0, 0, 0], [0, 1, 2, 3, 4], [1] * 5),
    ("count_previous", dict(seq_len=5, d_vocab=4), [0, 1, 2, 3, 0], [0, 0, 0, 0, 1], [1] * 5),
    (
        "count_previous",
        dict(seq_len=5, d_vocab=4, min_len=2),
        [2, 2, 1, 4, 4],
        [0, 1, 0, X, X],
        [1, 1, 1, 0, 0],
    ),
    (
        "count_previous",
        dict(seq_len=5, d_vocab=4, min_len=2),
        [1, 2, 1, 2, 4],
        [0, 0, 1, 1, X],
        [1, 1, 1, 1, 0],
    ),
    # reverse: token at L - 1 - t
    ("reverse", dict(seq_len=5, d_vocab=10), [1, 2, 3, 4, 5], [5, 4, 3, 2, 1], [1] * 5),
    ("reverse", dict(seq_len=5, d_vocab=10), [7, 7, 0, 9, 1], [1, 9, 0, 7, 7], [1] * 5),
    (
        "reverse",
        dict(seq_len=5, d_vocab=10, min_len=1),
        [4, 5, 6, 10, 10],
        [6, 5, 4, X, X],
        [1, 1, 1, 0, 0],
    ),
    (
        "reverse",
        dict(seq_len=5, d_vocab=10, min_len=1),
        [8, 10, 10, 10, 10],
        [8, X, X, X, X],
        [1, 0, 0, 0, 0],
    ),
    # histogram: copies of the token at t in the whole real sequence, t included
    ("histogram", dict(seq_len=5, d_vocab=4), [3, 1, 3, 3, 1], [3, 2, 3, 3, 2], [1] * 5),
    ("histogram", dict(seq_len=5, d_vocab=4), [0, 1, 2, 3, 0], [2, 1, 1, 1, 2], [1] * 5),
    ("histogram", dict(seq_len=5, d_vocab=4), [2, 2, 2, 2, 2], [5, 5, 5, 5, 5], [1] * 5),
    (
        "histogram",
        dict(seq_len=5, d_vocab=4, min_len=2),
        [1, 1, 2, 4, 4],
        [2, 2, 1, X, X],
        [1, 1, 1, 0, 0],
    ),
    # previous_token: token at t - 1, class d_vocab at t = 0
    ("previous_token", dict(seq_len=5, d_vocab=10), [3, 1, 4, 1, 5], [10, 3, 1, 4, 1], [1] * 5),
    (
        "previous_token",
        dict(seq_len=5, d_vocab=10, min_len=1),
        [3, 1, 4, 10, 10],
        [10, 3, 1, X, X],
        [1, 1, 1, 0, 0],
    ),
    (
        "previous_token",
        dict(seq_len=5, d_vocab=10, min_len=1),
        [7, 10, 10, 10, 10],
        [10, X, X, X, X],
        [1, 0, 0, 0, 0],
    ),
    # sort: t-th smallest real token
    ("sort", dict(seq_len=5, d_vocab=10), [3, 1, 4, 1, 5], [1, 1, 3, 4, 5], [1] * 5),
    ("sort", dict(seq_len=5, d_vocab=10), [9, 8, 7, 6, 5], [5, 6, 7, 8, 9], [1] * 5),
    (
        "sort",
        dict(seq_len=5, d_vocab=10, min_len=1),
        [9, 0, 5, 10, 10],
        [0, 5, 9, X, X],
        [1, 1, 1, 0, 0],
    ),
    # induction: next token, scored inside the second copy only; B read from the tokens
    ("induction", dict(seq_len=6), [5, 6, 7, 5, 6, 7], [X, X, X, 6, 7, X], [0, 0, 0, 1, 1, 0]),
    ("induction", dict(seq_len=6), [9, 8, 5, 6, 5, 6], [X, X, X, X, 6, X], [0, 0, 0, 0, 1, 0]),
    (
        "induction",
        dict(seq_len=7, d_vocab=5),
        [4, 1, 2, 3, 1, 2, 3],
        [X, X, X, X, 2, 3, X],
        [0, 0, 0, 0, 1, 1, 0],
    ),
    (  # no block length fits: nothing is scored
        "induction",
        dict(seq_len=8, d_vocab=5),
        [1, 2, 3, 4, 0, 1, 2, 3],
        [X] * 8,
        [0] * 8,
    ),
    # multi_relation: (previous, mirror, count_previous) at each position
    (
        "multi_relation",
        dict(seq_len=5, d_vocab=4),
        [3, 1, 3, 3, 1],
        [[4, 1, 0], [3, 3, 0], [1, 3, 1], [3, 1, 2], [3, 3, 1]],
        [1] * 5,
    ),
    (
        "multi_relation",
        dict(seq_len=5, d_vocab=4, min_len=1),
        [2, 0, 2, 4, 4],
        [[4, 2, 0], [2, 0, 0], [0, 2, 1], [X, X, X], [X, X, X]],
        [1, 1, 1, 0, 0],
    ),
]


@pytest.mark.parametrize(("name", "params", "tokens", "targets", "mask"), TARGET_CASES)
def test_targets_hand_computed(name, params, tokens, targets, mask) -> None:
    task = get_task(name, **params)
    got_targets, got_mask = task.targets_for(torch.tensor([tokens]))
    assert got_targets.dtype == torch.int64 and got_mask.dtype == torch.bool
    assert got_targets.tolist() == [targets]
    assert got_mask.tolist() == [[bool(m) for m in mask]]


def test_every_builtin_has_hand_computed_cases() -> None:
    assert {case[0] for case in TARGET_CASES} == set(BUILTIN_NAMES)
    padded = {case[0] for case in TARGET_CASES if case[1].get("min_len")}
    assert padded == set(VARIABLE_LENGTH_NAMES)


def test_targets_explicit_padding_mask_matches_inferred() -> None:
    task = get_task("reverse", seq_len=5, d_vocab=10, min_len=1)
    tokens = torch.tensor([[4, 5, 6, 10, 10], [1, 2, 3, 4, 5]])
    padding_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    targets, mask = task.targets_for(tokens, padding_mask)
    assert targets.tolist() == [[6, 5, 4, X, X], [5, 4, 3, 2, 1]]
    assert mask.tolist() == padding_mask.tolist()
    # padding positions are ignored whatever they hold when the mask is given
    targets2, _ = task.targets_for(tokens.masked_fill(~padding_mask, 0), padding_mask)
    assert targets2.tolist() == targets.tolist()


def test_targets_for_batches_rows_independently() -> None:
    task = get_task("count_previous", seq_len=5, d_vocab=4)
    rows = [[3, 1, 3, 3, 1], [0, 0, 0, 0, 0], [0, 1, 2, 3, 0]]
    targets, _ = task.targets_for(torch.tensor(rows))
    assert targets.tolist() == [[0, 0, 1, 2, 1], [0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]


# --------------------------------------------------------------------------- relation templates

T, F_ = True, False


def test_previous_token_template_literal() -> None:
    tokens = torch.tensor([[7, 8, 9, 0]])
    pm = torch.tensor([[T, T, T, F_]])
    expected = [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    out = previous_token_template(tokens, pm)
    assert out.dtype == torch.float32 and out.shape == (1, 4, 4)
    assert out[0].tolist() == expected


def test_mirror_template_literal_uses_real_length() -> None:
    tokens = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 4]])
    pm = torch.tensor([[T, T, T, F_], [T, T, T, T]])
    out = mirror_template(tokens, pm)
    assert out[0].tolist() == [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert out[1].tolist() == [[0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]]


def test_same_token_templates_literal() -> None:
    tokens = torch.tensor([[3, 1, 3, 3, 1]])
    before = same_token_template(tokens, strictly_before=True)[0].tolist()
    assert before == [
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [0, 1, 0, 0, 0],
    ]
    every = same_token_template(tokens)[0].tolist()
    assert every == [
        [1, 0, 1, 1, 0],
        [0, 1, 0, 0, 1],
        [1, 0, 1, 1, 0],
        [1, 0, 1, 1, 0],
        [0, 1, 0, 0, 1],
    ]


def test_same_token_template_ignores_padding_equal_tokens() -> None:
    # the padding positions hold 2, like position 0; they must not be counted
    tokens = torch.tensor([[2, 1, 2, 2]])
    pm = torch.tensor([[T, T, F_, F_]])
    assert same_token_template(tokens, pm)[0].tolist() == [
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 0, 0],
        [0, 0, 0, 0],
    ]


def test_simple_templates_literal() -> None:
    tokens = torch.tensor([[5, 6, 7, 0]])
    pm = torch.tensor([[T, T, T, F_]])
    assert self_template(tokens, pm)[0].tolist() == [
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 0],
    ]
    assert first_position_template(tokens, pm)[0].tolist() == [
        [1, 0, 0, 0],
        [1, 0, 0, 0],
        [1, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    assert uniform_template(tokens, pm, causal=True)[0].tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [0, 0, 0, 0],
    ]
    assert uniform_template(tokens, pm, causal=False)[0].tolist() == [
        [1, 1, 1, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 0],
        [0, 0, 0, 0],
    ]


def test_sort_source_template_literal_stable_ties() -> None:
    # sorted: 1 (pos 1), 1 (pos 3), 3 (pos 0), 4 (pos 2), 5 (pos 4)
    out = sort_source_template(torch.tensor([[3, 1, 4, 1, 5]]))[0]
    assert out.argmax(-1).tolist() == [1, 3, 0, 2, 4]
    assert out.tolist() == [
        [0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0],
        [1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1],
    ]


def test_induction_template_literal_with_repeats() -> None:
    # block [1, 2, 1, 3] repeated: 1 occurs at 0, 2, 4, 6
    out = induction_template(torch.tensor([[1, 2, 1, 3, 1, 2, 1, 3]]))[0].tolist()
    assert out == [
        [0, 0, 0, 0, 0, 0, 0, 0],  # q0: nothing earlier
        [0, 0, 0, 0, 0, 0, 0, 0],  # q1 (2): no earlier 2
        [0, 1, 0, 0, 0, 0, 0, 0],  # q2 (1): after pos 0
        [0, 0, 0, 0, 0, 0, 0, 0],  # q3 (3): no earlier 3
        [0, 1, 0, 1, 0, 0, 0, 0],  # q4 (1): after 0 and 2
        [0, 0, 1, 0, 0, 0, 0, 0],  # q5 (2): after 1
        [0, 1, 0, 1, 0, 1, 0, 0],  # q6 (1): after 0, 2, 4
        [0, 0, 0, 0, 1, 0, 0, 0],  # q7 (3): after 3
    ]


RELATION_CASES = [
    # (task, params, tokens, {relation: expected [q][k] matrix})
    (
        "count_previous",
        dict(seq_len=4, d_vocab=4, min_len=2),
        [2, 2, 1, 4],
        # the query's own position is part of the counted set: every real row is non-empty
        {"same_token_upto": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]},
    ),
    (
        "reverse",
        dict(seq_len=4, d_vocab=10, min_len=1),
        [4, 5, 6, 10],
        {"mirror": [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]},
    ),
    (
        "histogram",
        dict(seq_len=4, d_vocab=4),
        [1, 0, 1, 1],
        {"same_token": [[1, 0, 1, 1], [0, 1, 0, 0], [1, 0, 1, 1], [1, 0, 1, 1]]},
    ),
    (
        "previous_token",
        dict(seq_len=4, d_vocab=10),
        [3, 1, 4, 1],
        {"previous": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]},
    ),
    (
        "sort",
        dict(seq_len=4, d_vocab=10, min_len=1),
        [9, 0, 5, 10],
        {"sort_source": [[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]},
    ),
    (
        "induction",
        dict(seq_len=5, d_vocab=10),
        [9, 5, 6, 5, 6],
        {
            "induction": [
                [0, 0, 0, 0, 0],
                [0, 0, 0, 0, 0],
                [0, 0, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 0, 1, 0],
            ],
            "previous": [
                [0, 0, 0, 0, 0],
                [1, 0, 0, 0, 0],
                [0, 1, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 0, 1, 0],
            ],
        },
    ),
    (
        "multi_relation",
        dict(seq_len=4, d_vocab=4, min_len=1),
        [2, 0, 2, 4],
        {
            "previous": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
            "mirror": [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]],
            "same_token_upto": [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]],
        },
    ),
]


@pytest.mark.parametrize(("name", "params", "tokens", "expected"), RELATION_CASES)
def test_task_relations_literal(name, params, tokens, expected) -> None:
    task = get_task(name, **params)
    rel = task.relations(torch.tensor([tokens]))
    assert list(rel) == list(expected)
    assert task.relation_names == list(expected)
    for key, matrix in expected.items():
        assert rel[key].dtype == torch.float32
        assert rel[key][0].tolist() == matrix, key


def test_relation_templates_registry_names() -> None:
    names = {r for case in RELATION_CASES for r in case[3]}
    assert names <= set(RELATION_TEMPLATES)
    tokens = torch.tensor([[3, 1, 3, 3, 1]])
    assert torch.equal(
        RELATION_TEMPLATES["same_token_before"](tokens),
        same_token_template(tokens, strictly_before=True),
    )
    assert RELATION_TEMPLATES["same_token_upto"](tokens)[0].tolist() == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [0, 1, 0, 0, 1],
    ]
    assert torch.equal(
        RELATION_TEMPLATES["uniform_causal"](tokens), uniform_template(tokens, causal=True)
    )


# --------------------------------------------------------------------------- templates vs targets


def pointed_token(template: Tensor, tokens: Tensor) -> Tensor:
    """The token at the (single) key each row of a 0/1 template marks."""
    return torch.einsum("nqk,nk->nq", template, tokens.float()).round().long()


def check_pointer(template: Tensor, tokens: Tensor, targets: Tensor, rows: Tensor) -> None:
    """Each row in ``rows`` marks exactly one key, and that key holds the target."""
    assert (template.sum(-1)[rows] == 1).all()
    assert (pointed_token(template, tokens)[rows] == targets[rows]).all()


def check_count(template: Tensor, targets: Tensor, rows: Tensor) -> None:
    """Each row's sum equals the target (the number of marked keys)."""
    assert (template.sum(-1).long()[rows] == targets[rows]).all()


@pytest.mark.parametrize(
    ("name", "min_len"),
    [(name, None) for name in BUILTIN_NAMES] + [(name, 3) for name in VARIABLE_LENGTH_NAMES],
)
def test_templates_consistent_with_targets(name: str, min_len: int | None) -> None:
    task = get_task(name, seq_len=10, d_vocab=6, min_len=min_len)
    batch = task.sample(300, gen(1))
    rel = task.relations(batch.tokens, batch.padding_mask)
    tokens, targets, mask = batch.tokens, batch.targets, batch.mask
    assert (targets[mask] != X).all()
    if name == "count_previous":
        check_count(rel["same_token_upto"], targets + 1, mask)
    elif name == "histogram":
        check_count(rel["same_token"], targets, mask)
    elif name == "reverse":
        check_pointer(rel["mirror"], tokens, targets, mask)
    elif name == "sort":
        check_pointer(rel["sort_source"], tokens, targets, mask)
    elif name == "previous_token":
        first = torch.zeros_like(mask)
        first[:, 0] = True
        check_pointer(rel["previous"], tokens, targets, mask & ~first)
        assert (targets[:, 0] == task.d_vocab).all()
        assert (rel["previous"][:, 0].sum(-1) == 0).all()
    elif name == "induction":  # distinct blocks, prefix apart: the source is unambiguous
        check_pointer(rel["induction"], tokens, targets, mask)
        B = task.block_length_of(tokens)  # (n,)
        n_idx, q_idx = mask.nonzero(as_tuple=True)
        assert (rel["induction"][n_idx, q_idx, q_idx - B[n_idx] + 1] == 1).all()
    elif name == "multi_relation":
        first = torch.zeros_like(mask)
        first[:, 0] = True
        check_pointer(rel["previous"], tokens, targets[..., 0], mask & ~first)
        assert (targets[:, 0, 0] == task.d_vocab).all()
        check_pointer(rel["mirror"], tokens, targets[..., 1], mask)
        check_count(rel["same_token_upto"], targets[..., 2] + 1, mask)
    else:  # pragma: no cover - a new built-in needs a case here
        raise AssertionError(f"no consistency check for {name}")


# --------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_sample_shapes_and_value_ranges(name: str) -> None:
    task = get_task(name)
    batch = task.sample(2000, gen(0))
    n_targets = task.n_targets
    assert len(batch) == 2000
    assert batch.tokens.shape == (2000, 16) and batch.tokens.dtype == torch.int64
    expected = (2000, 16) if n_targets == 1 else (2000, 16, n_targets)
    assert batch.targets.shape == expected
    assert batch.padding_mask.all() and task.pad_token is None
    assert batch.tokens.min() >= 0 and batch.tokens.max() < task.d_vocab
    full_mask = batch.mask if n_targets == 1 else batch.mask[..., None].expand(expected)
    scored = batch.targets[full_mask]
    assert scored.min() >= 0 and scored.max() < task.d_vocab_out
    assert (batch.targets[~full_mask] == X).all()


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_same_seed_same_batch_different_seed_different_batch(name: str) -> None:
    task = get_task(name)
    assert_batches_equal(task.sample(64, gen(3)), task.sample(64, gen(3)))
    assert not torch.equal(task.sample(64, gen(3)).tokens, task.sample(64, gen(4)).tokens)


def test_sample_with_global_generator_follows_manual_seed() -> None:
    task = get_task("sort")
    torch.manual_seed(11)
    a = task.sample(8)
    torch.manual_seed(11)
    assert_batches_equal(a, task.sample(8))


def test_induction_sample_structure() -> None:
    task = get_task("induction", seq_len=16, d_vocab=10)
    assert list(task.block_lengths) == [4, 5, 6, 7, 8]
    batch = task.sample(500, gen(5))
    B = task.block_length_of(batch.tokens)
    assert set(B.tolist()) == {4, 5, 6, 7, 8}  # the offset to the answer varies
    for n in range(500):
        b, tokens = int(B[n]), batch.tokens[n]
        first, second, prefix = tokens[16 - 2 * b : 16 - b], tokens[16 - b :], tokens[: 16 - 2 * b]
        assert torch.equal(first, second) and len(set(first.tolist())) == b  # distinct block
        assert not set(prefix.tolist()) & set(first.tolist())  # the prefix differs from it
        expected = [False] * (16 - b) + [True] * (b - 1) + [False]
        assert batch.mask[n].tolist() == expected
    odd = get_task("induction", seq_len=9, d_vocab=5)  # B in [2, 4]; B = 4 leaves 1 prefix token
    assert set(odd.block_length_of(odd.sample(300, gen(6)).tokens).tolist()) == {2, 3, 4}
    fixed = get_task("induction", seq_len=16, d_vocab=10, min_block=8)
    assert set(fixed.block_length_of(fixed.sample(50, gen(7)).tokens).tolist()) == {8}


def test_induction_rejects_a_vocabulary_too_small_for_distinct_blocks() -> None:
    with pytest.raises(ValueError, match=r"d_vocab=3 is invalid: an integer >= 6 for induction"):
        get_task("induction", seq_len=12, d_vocab=3)
    with pytest.raises(ValueError, match=r"min_block=9 is invalid"):
        get_task("induction", seq_len=16, min_block=9)


# --------------------------------------------------------------------------- variable length


@pytest.mark.parametrize("name", VARIABLE_LENGTH_NAMES)
def test_variable_length_padding(name: str) -> None:
    task = get_task(name, seq_len=10, d_vocab=5, min_len=3)
    assert task.pad_token == 5 and task.d_vocab_in == 6 and task.variable_length
    batch = task.sample(400, gen(8))
    pm = batch.padding_mask
    lengths = pm.sum(-1)
    assert lengths.min() == 3 and lengths.max() == 10
    assert lengths.unique().tolist() == list(range(3, 11))  # every length occurs
    assert torch.equal(pm, torch.arange(10)[None] < lengths[:, None])  # padding at the end
    assert (batch.tokens[~pm] == 5).all()
    assert (batch.tokens[pm] < 5).all()
    assert not batch.mask[~pm].any()
    assert (batch.targets[~pm] == X).all()
    assert torch.equal(batch.mask, pm)  # every real position is scored in these tasks
    for key, template in task.relations(batch.tokens, pm).items():
        assert (template[~pm] == 0).all(), key  # padding query rows
        assert (template.transpose(1, 2)[~pm] == 0).all(), key  # padding key columns
    # labels are computed on the real part only: equal to labelling each length separately
    short = batch[lengths == 3]
    refilled = short.tokens.clone()
    refilled[:, 3:] = 0  # whatever the padding holds, it is ignored given the padding mask
    targets, _ = task.targets_for(refilled, short.padding_mask)
    assert torch.equal(targets, short.targets)


def test_induction_rejects_variable_length() -> None:
    with pytest.raises(ValueError, match=r"min_len=8.*induction.*variable length"):
        get_task("induction", seq_len=16, min_len=8)
    assert get_task("induction", seq_len=16, min_len=16).pad_token is None


# --------------------------------------------------------------------------- eval set


def test_eval_batch_fixed_across_calls_and_objects() -> None:
    a = get_task("count_previous", seq_len=12, d_vocab=7).eval_batch(256)
    b = get_task("count_previous", seq_len=12, d_vocab=7).eval_batch(256)
    c = CountPreviousTask(seq_len=12, d_vocab=7).eval_batch(256)
    assert_batches_equal(a, b)
    assert_batches_equal(a, c)
    assert len(get_task("count_previous").eval_batch()) == 1024


def test_eval_batch_depends_on_name_and_params_not_training_seeds() -> None:
    base = get_task("reverse", seq_len=12)
    other = get_task("reverse", seq_len=12, d_vocab=11)
    assert base.eval_seed != other.eval_seed
    assert base.eval_seed != get_task("sort", seq_len=12).eval_seed
    assert base.eval_seed >= 2**32  # never a 32-bit training seed
    tokens = base.eval_batch(64).tokens
    for seed in range(3):
        assert not torch.equal(tokens, base.sample(64, gen(seed)).tokens)


def test_eval_seed_is_stable_hash() -> None:
    # pinned: a stable hashlib hash of (name, params), identical in every process
    assert get_task("count_previous").eval_seed == 7858122155891906729
    assert get_task("count_previous", min_len=16).eval_seed == 7858122155891906729


# --------------------------------------------------------------------------- attributes


ATTRIBUTES = [
    # name, d_vocab_out, n_targets, target_names, causal, min_layers (seq_len=16, d_vocab=10)
    ("count_previous", 16, 1, ["count_previous"], True, 1),
    ("reverse", 10, 1, ["reverse"], False, 1),
    ("histogram", 17, 1, ["histogram"], False, 1),
    ("previous_token", 11, 1, ["previous_token"], True, 1),
    ("sort", 10, 1, ["sort"], False, 1),
    ("induction", 10, 1, ["induction"], True, 2),
    ("multi_relation", 16, 3, ["previous", "mirror", "count_previous"], False, 1),
]


@pytest.mark.parametrize(
    ("name", "d_vocab_out", "n_targets", "target_names", "causal", "min_layers"), ATTRIBUTES
)
def test_task_attributes(name, d_vocab_out, n_targets, target_names, causal, min_layers) -> None:
    task = get_task(name)
    assert task.name == name
    assert (task.seq_len, task.d_vocab, task.min_len) == (16, 10, 16)
    assert task.pad_token is None and task.d_vocab_in == 10
    assert task.d_vocab_out == d_vocab_out
    assert task.n_targets == n_targets
    assert task.target_names == target_names
    assert task.causal is causal
    assert task.min_layers == min_layers
    assert task.model_kwargs() == dict(
        n_ctx=16,
        d_vocab=10,
        d_vocab_out=d_vocab_out,
        n_targets=n_targets,
        causal=causal,
        n_layers=min_layers,
    )
    assert type(task).__doc__ and len(type(task).__doc__) > 100


def test_multi_relation_vocab_out_grows_with_vocab() -> None:
    assert get_task("multi_relation", seq_len=8, d_vocab=20).d_vocab_out == 21
    assert get_task("multi_relation", seq_len=8, d_vocab=20, min_len=4).d_vocab_in == 21


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_params_rebuild_equal_task(name: str) -> None:
    params = dict(seq_len=9, d_vocab=7)
    if name != "induction":
        params["min_len"] = 4
    task = get_task(name, **params)
    extra = {"min_block": 2} if name == "induction" else {}
    assert task.params == {**params, "min_len": params.get("min_len", 9), **extra}
    assert json.loads(json.dumps(task.params)) == task.params
    rebuilt = get_task(task.name, **task.params)
    assert rebuilt == task and hash(rebuilt) == hash(task)
    assert rebuilt != get_task(name, seq_len=10, d_vocab=7)


def test_repr() -> None:
    assert repr(get_task("reverse", seq_len=8, d_vocab=5, min_len=4)) == (
        "ReverseTask(name='reverse', seq_len=8, d_vocab=5, min_len=4)"
    )


def test_builtins_registered() -> None:
    assert list_tasks() == sorted(list_tasks())
    assert set(BUILTIN_NAMES) <= set(list_tasks())
    assert {cls.name for cls in BUILTIN_TASKS} == set(BUILTIN_NAMES)
    assert accepted_params("sort") == ["seq_len", "d_vocab", "min_len"]


# --------------------------------------------------------------------------- Batch


def make_batch() -> Batch:
    return get_task("reverse", seq_len=5, min_len=2).sample(6, gen(9))


def test_batch_indexing_keeps_rows() -> None:
    batch = make_batch()
    assert len(batch) == 6
    one = batch[2]
    assert one.tokens.shape == (1, 5)
    assert torch.equal(one.tokens[0], batch.tokens[2])
    assert torch.equal(batch[-1].targets[0], batch.targets[5])
    assert len(batch[1:4]) == 3 and torch.equal(batch[1:4].mask, batch.mask[1:4])
    picked = batch[torch.tensor([4, 0])]
    assert torch.equal(picked.padding_mask, batch.padding_mask[[4, 0]])
    assert torch.equal(batch[[1, 3]].tokens, batch.tokens[[1, 3]])
    with pytest.raises(TypeError, match="rows only"):
        batch[0, 1]


def test_batch_to_and_n_targets() -> None:
    batch = make_batch()
    moved = batch.to("cpu")
    assert_batches_equal(batch, moved)
    assert moved.device == torch.device("cpu") and batch.n_targets == 1
    assert get_task("multi_relation", seq_len=4).sample(2, gen(0)).n_targets == 3


def test_batch_validation() -> None:
    ok = dict(
        tokens=torch.zeros(2, 3, dtype=torch.int64),
        targets=torch.zeros(2, 3, dtype=torch.int64),
        mask=torch.ones(2, 3, dtype=torch.bool),
        padding_mask=torch.ones(2, 3, dtype=torch.bool),
    )
    with pytest.raises(TypeError, match="tokens must be int64"):
        Batch(**{**ok, "tokens": torch.zeros(2, 3, dtype=torch.int32)})
    with pytest.raises(TypeError, match="mask must be bool"):
        Batch(**{**ok, "mask": torch.ones(2, 3)})
    with pytest.raises(
        ValueError,
        match=r"Batch.padding_mask is invalid: the shape of tokens \(2, 3\), got \(2, 4\)",
    ):
        Batch(**{**ok, "padding_mask": torch.ones(2, 4, dtype=torch.bool)})
    with pytest.raises(ValueError, match="Batch.targets is invalid: shape"):
        Batch(**{**ok, "targets": torch.zeros(2, 4, dtype=torch.int64)})
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        Batch(**{**ok, "tokens": [[0, 0, 0]]})


# --------------------------------------------------------------------------- errors


def test_unknown_task_lists_names() -> None:
    with pytest.raises(ValueError, match="task='nope' is invalid: a registered task") as info:
        get_task("nope")
    for name in BUILTIN_NAMES:
        assert name in str(info.value)


def test_unknown_parameter_lists_accepted() -> None:
    with pytest.raises(ValueError, match=r"params=\['seq_length'\] is invalid") as info:
        get_task("reverse", seq_length=8)
    assert "parameters of task 'reverse': seq_len, d_vocab, min_len" in str(info.value)


@pytest.mark.parametrize(
    ("params", "error", "pattern"),
    [
        (dict(seq_len=1), ValueError, r"seq_len=1 is invalid: an integer >= 2"),
        (dict(d_vocab=1), ValueError, r"d_vocab=1 is invalid: an integer >= 2"),
        (dict(min_len=0), ValueError, r"min_len=0 is invalid: an integer >= 1"),
        (dict(min_len=17), ValueError, r"min_len=17 is invalid: an integer >= 1 and <= seq_len=16"),
        (dict(seq_len=10**20), ValueError, r"seq_len=100000000000000000000 is invalid: .*<= 65536"),
        (dict(seq_len=4, min_len=5), ValueError, r"min_len=5 .* seq_len=4"),
        (dict(seq_len=2.5), TypeError, r"seq_len=2.5 is invalid: an integer"),
        (dict(d_vocab=True), TypeError, r"d_vocab=True is invalid"),
        (dict(seq_len="16"), TypeError, r"seq_len='16' is invalid"),
    ],
)
def test_bad_values(params, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        get_task("count_previous", **params)


def test_induction_too_short() -> None:
    with pytest.raises(ValueError, match=r"seq_len=4 is invalid: an integer >= 5 for induction"):
        get_task("induction", seq_len=4)


def test_bad_inputs_to_targets_and_relations() -> None:
    task = get_task("reverse", seq_len=4, d_vocab=5)
    with pytest.raises(
        ValueError, match=r"tokens is invalid: 4 positions \(.* has seq_len=4\), got 3"
    ):
        task.targets_for(torch.tensor([[1, 2, 3]]))
    with pytest.raises(
        ValueError, match=r"tokens is invalid: real \(non-padding\) ids in \[0, 5\).*\[7\]"
    ):
        task.targets_for(torch.tensor([[1, 2, 3, 7]]))
    with pytest.raises(TypeError, match="integer dtype"):
        task.relations(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    with pytest.raises(ValueError, match=r"tokens\[None\]"):
        task.targets_for(torch.tensor([1, 2, 3, 4]))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        task.targets_for([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="padding at the END"):
        task.relations(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[T, F_, T, T]]))
    with pytest.raises(TypeError, match="padding_mask must be a bool tensor"):
        task.relations(torch.tensor([[1, 2, 3, 4]]), torch.ones(1, 4))
    with pytest.raises(ValueError, match="n=0 is invalid"):
        task.sample(0)
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None"):
        task.sample(2, generator=0)


def test_register_duplicate_and_bad_factory() -> None:
    with pytest.raises(
        ValueError, match=r"name='reverse' is invalid: a name not reg.*overwrite=True"
    ):
        register_task("reverse", ReverseTask)
    with pytest.raises(TypeError, match="factory=3 is invalid: a Task subclass or a callable"):
        register_task("not_callable", 3)
    with pytest.raises(ValueError, match="non-empty"):
        register_task("  ", ReverseTask)
    with pytest.raises(ValueError, match="name='never_registered' is invalid: a registered task"):
        unregister_task("never_registered")


# --------------------------------------------------------------------------- user tasks


class ShiftTask(Task):
    """Target at t = (token at t + offset) mod d_vocab; relation ``self``."""

    name = "shift"
    causal = True

    def __init__(
        self, seq_len: int = 6, d_vocab: int = 5, min_len: int | None = None, offset: int = 1
    ) -> None:
        super().__init__(seq_len=seq_len, d_vocab=d_vocab, min_len=min_len)
        self.offset = offset

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def compute_targets(self, tokens, padding_mask):
        return (tokens + self.offset) % self.d_vocab, padding_mask

    def compute_relations(self, tokens, padding_mask):
        return {"self": self_template(tokens, padding_mask)}


@pytest.fixture
def shift_registered():
    register_task("test_shift", ShiftTask)
    register_task("test_shift_fn", lambda offset=2: ShiftTask(offset=offset))
    yield
    unregister_task("test_shift")
    unregister_task("test_shift_fn")


def test_custom_task_through_registry(shift_registered) -> None:
    assert {"test_shift", "test_shift_fn"} <= set(list_tasks())
    task = get_task("test_shift", seq_len=4, offset=3)
    assert task.name == "test_shift"  # the registry name wins
    assert task.params == dict(seq_len=4, d_vocab=5, min_len=4, offset=3)
    targets, mask = task.targets_for(torch.tensor([[0, 1, 2, 4]]))
    assert targets.tolist() == [[3, 4, 0, 2]] and mask.all()
    assert task.relations(torch.tensor([[0, 1, 2, 4]]))["self"][0].tolist() == [
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 1],
    ]
    batch = task.sample(32, gen(0))
    assert torch.equal(batch.targets, (batch.tokens + 3) % 5)
    assert_batches_equal(
        task.eval_batch(16), get_task("test_shift", seq_len=4, offset=3).eval_batch(16)
    )
    assert get_task(task.name, **task.params) == task
    with pytest.raises(
        ValueError, match=r"parameters of task 'test_shift': seq_len, d_vocab, min_len, offset"
    ):
        get_task("test_shift", ofset=3)

    fn_task = get_task("test_shift_fn")
    assert fn_task.name == "test_shift_fn" and fn_task.offset == 2
    with pytest.raises(ValueError, match=r"parameters of task 'test_shift_fn': offset$"):
        get_task("test_shift_fn", seq_len=4)


def test_custom_task_overwrite(shift_registered) -> None:
    register_task("test_shift", CountPreviousTask, overwrite=True)
    assert isinstance(get_task("test_shift"), CountPreviousTask)


def test_factory_must_return_task(shift_registered) -> None:
    message = "task 'test_shift_fn': factory is invalid: .*<lambda> must return a Task, got str"
    with pytest.raises(InvalidTaskError, match=message):
        register_task("test_shift_fn", lambda: "not a task", overwrite=True)
    assert get_task("test_shift_fn").offset == 2  # the refused factory replaced nothing


def test_custom_task_with_bad_targets_is_caught() -> None:
    class Broken(ShiftTask):
        def compute_targets(self, tokens, padding_mask):
            return tokens + 100, padding_mask

    message = r"task 'shift': compute_targets is invalid: targets must lie in \[0, d_vocab_out=5\)"
    with pytest.raises(InvalidTaskError, match=message):
        Broken().sample(4, gen(0))


def test_a_task_whose_tokens_leave_its_vocabulary_is_refused_when_registered() -> None:
    class OutOfVocabulary(ShiftTask):
        def sample_tokens(self, n, lengths, generator):
            return torch.full((n, self.seq_len), self.d_vocab_in)  # one past the last id

    message = (
        r"task 'test_out_of_vocabulary': sample_tokens is invalid: "
        r"tokens must lie in \[0, d_vocab_in=5\), got \[5, 5, 5, 5, 5\]"
    )
    with pytest.raises(InvalidTaskError, match=message):
        register_task("test_out_of_vocabulary", OutOfVocabulary)
    with pytest.raises(ValueError, match="a registered task"):
        get_task("test_out_of_vocabulary")  # the refused task was not registered


def test_direct_construction_equals_registry() -> None:
    assert InductionTask(seq_len=8) == get_task("induction", seq_len=8)
    assert list(get_task("induction", seq_len=8).block_lengths) == [2, 3, 4]


# ----- tasks defined outside mhainterp: files, modules, entry points, run folders -------------
def test_a_task_in_a_users_file_is_registered_with_its_module(user_task_file):
    from mhainterp.tasks import load_task_module, task_module, task_record

    assert "two_back" not in list_tasks()
    assert load_task_module(str(user_task_file)) == ["two_back"]
    assert load_task_module(str(user_task_file)) == ["two_back"]  # a second load is a no-op
    task = get_task("two_back", seq_len=6)
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9]])
    assert task.targets_for(tokens)[0].tolist() == [[10, 10, 3, 1, 4, 1]]
    assert task_module("two_back") == str(user_task_file.resolve())
    assert task_record(task) == {
        "name": "two_back",
        "params": {"seq_len": 6, "d_vocab": 10, "min_len": 6},
        "module": str(user_task_file.resolve()),
    }
    assert task_module("reverse") == "mhainterp.tasks.builtin"


def test_a_task_in_an_importable_module_records_the_module_name(user_task_file, monkeypatch):
    from mhainterp.tasks import load_task_module, task_module

    monkeypatch.syspath_prepend(str(user_task_file.parent.parent))
    (user_task_file.parent / "__init__.py").write_text("")
    assert load_task_module("user_tasks.two_back") == ["two_back"]
    assert task_module("two_back") == "user_tasks.two_back"


def test_task_module_errors_name_the_module(tmp_path):
    from mhainterp.tasks import load_task_module

    with pytest.raises(FileNotFoundError, match="no such file"):
        load_task_module(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="no module named 'no_such_mod'"):
        load_task_module("no_such_mod")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('oops')\n")
    with pytest.raises(ValueError, match=r"broken.py' failed: RuntimeError: oops"):
        load_task_module(str(broken))


def test_an_unregistered_run_task_says_what_to_import_and_imports_nothing(tmp_path):
    from mhainterp.tasks import task_from_record

    marker = tmp_path / "imported"
    module = tmp_path / "evil.py"
    module.write_text(f"open({str(marker)!r}, 'w').close()\n")
    record = {"name": "not_here", "params": {}, "module": str(module)}
    with pytest.raises(ValueError) as error:
        task_from_record(record, "run/config.json")
    assert str(error.value) == (
        f"run/config.json: task 'not_here' is not registered; it was defined in {module}. "
        f"Load it first: --task-module {module} on the command line, or "
        f"mhainterp.tasks.load_task_module({str(module)!r}) in Python"
    )
    assert not marker.exists()  # the folder named the module; nobody imported it
    old_run = {"name": "reverse", "params": {"seq_len": 8}}  # written before "module" existed
    assert task_from_record(old_run).seq_len == 8
    with pytest.raises(ValueError, match=r"does not say which module.*--task-module"):
        task_from_record({"name": "not_here", "params": {}}, "old/config.json")


def _fake_distribution(root, entry_points: str, source: str):
    """A package 'mylab' installed under ``root`` (a dist-info folder and its module)."""
    dist = root / "mylab-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[mhainterp.tasks]\n{entry_points}\n")
    classes_only = source.split('register_task("two_back"')[0]  # the package registers nothing
    (root / "mylab_tasks.py").write_text(classes_only)


def test_entry_point_tasks_appear_in_the_registry(tmp_path, monkeypatch, user_task_source):
    from mhainterp.tasks import load_entry_point_tasks, task_module

    _fake_distribution(tmp_path, "two_back_ep = mylab_tasks:TwoBackTask", user_task_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_entry_point_tasks() == ["two_back_ep"]
        assert get_task("two_back_ep", seq_len=4).d_vocab_out == 11
        assert task_module("two_back_ep") == "mylab_tasks"
        assert load_entry_point_tasks() == []  # already registered: nothing new
    finally:
        unregister_task("two_back_ep")


def test_a_broken_entry_point_is_skipped_with_a_warning(tmp_path, monkeypatch, user_task_source):
    from mhainterp.tasks import load_entry_point_tasks

    _fake_distribution(tmp_path, "gone = mylab_missing:Nothing", user_task_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match=r"skipped task entry point 'gone'.*package 'mylab'"):
        assert load_entry_point_tasks() == []


def test_the_evaluation_set_is_built_once_per_size_and_shared() -> None:
    task = get_task("reverse")
    first = task.eval_batch(64)
    assert task.eval_batch(64) is first  # an analysis asks for it many times: built once
    assert get_task("reverse").eval_batch(64).tokens.equal(first.tokens)  # same in any instance
    assert len(task.eval_batch(32)) == 32
    for n in range(1, 8):
        task.eval_batch(n)
    assert len(task.__dict__["_eval_batches"]) <= 4  # bounded


def test_a_seq_len_whose_templates_cannot_fit_is_refused_before_they_are_built(monkeypatch):
    """reverse at seq_len 65,536 (the top of the allowed range): its relation templates alone
    are [4, L, L], 64 GiB. The contract check used to build them and be killed by the
    kernel; it now refuses in one line first. An allocation that fails inside a task's code
    anyway is the machine's limit, not an invalid task."""
    from mhainterp import io as io_module
    from mhainterp.errors import NotEnoughMemoryError
    from mhainterp.tasks import get_task

    monkeypatch.setattr(io_module, "available_memory", lambda: 2**30)  # 1 GiB, any machine
    with pytest.raises(NotEnoughMemoryError, match=r"relation templates of task 'reverse' "):
        get_task("reverse", seq_len=65536)
    monkeypatch.undo()

    from mhainterp.tasks.contract import _call

    def fails():
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"
        )

    with pytest.raises(NotEnoughMemoryError, match="compute_relations of task"):
        _call(get_task("reverse"), "compute_relations", fails)
