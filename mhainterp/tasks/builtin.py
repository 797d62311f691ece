"""The built-in tasks. Each docstring says what the target is and which relation solves it.

Shapes: n sequences, pos positions, q/k query/key positions; ``L`` is a sequence's real length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.runtime import DRAW_DEVICE
from mhainterp.tasks.base import Task
from mhainterp.tasks.templates import (
    induction_template,
    mirror_template,
    previous_token_template,
    same_token_template,
    sort_source_template,
)
from mhainterp.validation import check_int, invalid

__all__ = [
    "CountPreviousTask",
    "HistogramTask",
    "InductionTask",
    "MultiRelationTask",
    "PreviousTokenTask",
    "ReverseTask",
    "SortTask",
]

Targets = tuple[Int[Tensor, "n pos"], Bool[Tensor, "n pos"]]
Relations = dict[str, Float[Tensor, "n q k"]]


def _count_previous(tokens: Int[Tensor, "n pos"]) -> Int[Tensor, "n pos"]:
    """How many earlier positions hold the same token (padding sits after, so never counted):
    the ``[n, q, k]`` token matches below the diagonal (``k < q``), summed over ``k``; three
    device ops for the whole batch, whatever ``pos``."""
    same = tokens[:, :, None] == tokens[:, None, :]  # (n, q, k)
    return same.tril(-1).sum(-1).to(tokens.dtype)


def _mirror(
    tokens: Int[Tensor, "n pos"], padding_mask: Bool[Tensor, "n pos"]
) -> Int[Tensor, "n pos"]:
    """``tokens[L - 1 - t]`` (clamped to 0 at padding positions, which are masked anyway)."""
    lengths = padding_mask.sum(-1, keepdim=True)  # (n, 1)
    one_based = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)  # t + 1
    return tokens.gather(-1, (lengths - one_based).clamp(min=0))


def _previous(tokens: Int[Tensor, "n pos"], first: int) -> Int[Tensor, "n pos"]:
    """``tokens[t - 1]``, and the class ``first`` at ``t = 0``."""
    return F.pad(tokens[:, :-1], (1, 0), value=first)  # one op: shifted right, ``first`` in


class CountPreviousTask(Task):
    """Count earlier copies: the target at ``t`` is how many earlier positions ``k < t`` hold the
    same token as ``t`` (0 .. seq_len - 1, so ``d_vocab_out = seq_len``). Solved by attending
    uniformly to the copies of the current token up to and including ``t`` itself, relation
    ``same_token_upto``, whose row sum is the target + 1: the query's own position is part of
    the mechanism (a counting head reads the count from the share ``1 / (count + 1)`` that each
    copy, or a sink, gets).

    Example:
        >>> CountPreviousTask(seq_len=5, d_vocab=4).targets_for(
        ...     torch.tensor([[3, 1, 3, 3, 1]]))[0].tolist()
        [[0, 0, 1, 2, 1]]
    """

    name = "count_previous"
    causal = True

    @property
    def d_vocab_out(self) -> int:
        return self.seq_len

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        return _count_previous(tokens), padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {"same_token_upto": same_token_template(tokens, padding_mask, up_to_self=True)}


class ReverseTask(Task):
    """Reverse the sequence: the target at ``t`` is the token at ``L - 1 - t`` of the real
    sequence (``d_vocab_out = d_vocab``). Solved by attending to the mirrored position,
    relation ``mirror``; needs a bidirectional model.

    Example:
        >>> ReverseTask(seq_len=4).targets_for(torch.tensor([[1, 2, 3, 4]]))[0].tolist()
        [[4, 3, 2, 1]]
    """

    name = "reverse"
    causal = False

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        return _mirror(tokens, padding_mask), padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {"mirror": mirror_template(tokens, padding_mask)}


class HistogramTask(Task):
    """Token histogram: the target at ``t`` is how many positions of the whole real sequence hold
    the token at ``t``, ``t`` itself included (1 .. seq_len, so ``d_vocab_out = seq_len + 1``).
    Solved by attending to every copy of the current token, relation ``same_token``, whose row
    sum is the target; needs a bidirectional model.

    Example:
        >>> HistogramTask(seq_len=5, d_vocab=4).targets_for(
        ...     torch.tensor([[3, 1, 3, 3, 1]]))[0].tolist()
        [[3, 2, 3, 3, 2]]
    """

    name = "histogram"
    causal = False

    @property
    def d_vocab_out(self) -> int:
        return self.seq_len + 1

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        binned = tokens.masked_fill(~padding_mask, self.d_vocab)  # padding -> its own bin
        per_value = binned.new_zeros(tokens.shape[0], self.d_vocab + 1)
        per_value = per_value.scatter_add_(1, binned, torch.ones_like(binned))
        return per_value.gather(1, binned), padding_mask  # (n, pos): count of own token

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {"same_token": same_token_template(tokens, padding_mask)}


class PreviousTokenTask(Task):
    """Copy the previous token: the target at ``t`` is the token at ``t - 1``; at ``t = 0`` it is
    the extra class ``d_vocab`` (so ``d_vocab_out = d_vocab + 1``). Solved by attending one
    position back, relation ``previous``.

    Example:
        >>> PreviousTokenTask(seq_len=5).targets_for(
        ...     torch.tensor([[3, 1, 4, 1, 5]]))[0].tolist()
        [[10, 3, 1, 4, 1]]
    """

    name = "previous_token"
    causal = True

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab + 1

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        return _previous(tokens, first=self.d_vocab), padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {"previous": previous_token_template(tokens, padding_mask)}


class SortTask(Task):
    """Sort the sequence: the target at ``t`` is the ``t``-th smallest token of the real sequence
    (``d_vocab_out = d_vocab``). Solved by attending to where that token sits, relation
    ``sort_source`` (ties broken by position, a stable sort); needs a bidirectional model.

    Example:
        >>> SortTask(seq_len=5).targets_for(torch.tensor([[3, 1, 4, 1, 5]]))[0].tolist()
        [[1, 1, 3, 4, 5]]
    """

    name = "sort"
    causal = False

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        keys = tokens.masked_fill(~padding_mask, torch.iinfo(torch.int64).max)  # padding last
        return torch.sort(keys, dim=-1, stable=True).values, padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {"sort_source": sort_source_template(tokens, padding_mask)}


class InductionTask(Task):
    """Induction: a block of ``B`` distinct tokens, then the same block again, at the end of the
    sequence after ``seq_len - 2B`` prefix tokens that differ from the block. ``B`` is drawn per
    sequence from ``[min_block, seq_len // 2]`` (default ``min_block = max(2, seq_len // 4)``),
    so the distance back to the answer varies: no attention head at a fixed offset, and no
    one-layer model, can solve it. At each position ``t`` of the second copy whose next token is
    still inside it, the target is that next token ``tokens[t + 1]``; other positions are not
    scored (``d_vocab_out = d_vocab``). Solved by a two-layer circuit: a ``previous``-token head
    in layer 0, then an ``induction`` head in layer 1 that attends to the key whose previous token
    is the query's token (``k = t - B + 1``, the only such key). ``B`` is read back from the
    tokens (the one length whose last two blocks are equal), so targets follow from tokens
    alone. Causal; fixed length; ``d_vocab >= (seq_len + 1) // 2`` so the blocks can be distinct.
    With ``min_block = seq_len // 2`` the offset is fixed (one positional head solves it).

    Example:
        >>> task = InductionTask(seq_len=7, d_vocab=5)
        >>> task.targets_for(torch.tensor([[4, 1, 2, 3, 1, 2, 3]]))[0].tolist()
        [[-100, -100, -100, -100, 2, 3, -100]]
        >>> task.targets_for(torch.tensor([[4, 3, 0, 1, 2, 1, 2]]))[0].tolist()  # B = 2
        [[-100, -100, -100, -100, -100, 2, -100]]
    """

    name = "induction"
    causal = True
    min_layers = 2

    def __init__(
        self,
        seq_len: int = 16,
        d_vocab: int = 10,
        min_len: int | None = None,
        min_block: int | None = None,
    ) -> None:
        super().__init__(seq_len=seq_len, d_vocab=d_vocab, min_len=min_len)
        if self.seq_len < 5:
            raise invalid(
                "seq_len",
                seq_len,
                "an integer >= 5 for induction (two block lengths, so the "
                "offset to the answer varies)",
            )
        if self.min_len != self.seq_len:
            raise invalid(
                "min_len",
                min_len,
                f"unset or equal to seq_len={self.seq_len} for induction "
                "(the blocks fill the sequence: variable length does not apply)",
            )
        if self.d_vocab < (self.seq_len + 1) // 2:
            raise invalid(
                "d_vocab",
                d_vocab,
                f"an integer >= {(self.seq_len + 1) // 2} for induction "
                f"with seq_len={self.seq_len} (a block of seq_len // 2 distinct tokens, and "
                "prefix tokens that differ from it)",
            )
        default = max(2, self.seq_len // 4)
        chosen = default if min_block is None else min_block
        self.min_block = check_int("min_block", chosen, minimum=2, maximum=self.seq_len // 2)

    @property
    def block_lengths(self) -> range:
        """The block lengths ``B`` a sequence can have."""
        return range(self.min_block, self.seq_len // 2 + 1)

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def sample_tokens(self, n: int, lengths: Tensor, generator: torch.Generator | None) -> Tensor:
        T, V = self.seq_len, self.d_vocab
        draw = {"generator": generator, "device": DRAW_DEVICE}
        sizes = torch.tensor(list(self.block_lengths), device=DRAW_DEVICE)
        B = sizes[torch.randint(0, len(sizes), (n,), **draw)]  # (n,)
        perm = torch.rand(n, V, **draw).argsort(dim=-1)  # (n, V) distinct values
        pos = torch.arange(T, device=DRAW_DEVICE)[None, :]  # (1, T)
        start = T - 2 * B[:, None]  # (n, 1): first position of the first copy
        in_blocks = pos >= start
        index_in_block = (pos - start) % B[:, None]  # (n, T), meaningful inside the blocks
        block_tokens = perm.gather(1, index_in_block.clamp(max=V - 1))
        # Prefix tokens: drawn with replacement from the values the block does not use.
        spare = torch.randint(0, V, (n, T), **draw) % (V - B[:, None]).clamp(min=1)
        prefix_tokens = perm.gather(1, (B[:, None] + spare).clamp(max=V - 1))
        return torch.where(in_blocks, block_tokens, prefix_tokens)  # (n, T)

    def block_length_of(self, tokens: Int[Tensor, "n pos"]) -> Int[Tensor, " n"]:
        """Each sequence's ``B`` read from its tokens (0 where no block length fits): the
        largest ``B`` whose last two blocks are equal (unique for sampled tokens). Every ``B``
        is tested at once: row ``b`` of a ``[len(block_lengths), seq_len // 2]`` index pairs
        the last block's positions with the block before them (unused slots pair the last
        position with itself, which always matches)."""
        T = tokens.shape[-1]
        sizes = list(self.block_lengths)
        width = max(sizes)
        pairs = [
            [(T - B + j, T - 2 * B + j) if j < B else (T - 1, T - 1) for j in range(width)]
            for B in sizes
        ]  # (n_B, width, 2): (position, position B earlier)
        index = torch.tensor(pairs, device=tokens.device)
        picked = tokens[:, index]  # (n, n_B, width, 2)
        equal = (picked[..., 0] == picked[..., 1]).all(dim=-1)  # (n, n_B)
        lengths = torch.tensor(sizes, dtype=torch.int64, device=tokens.device)
        return (equal * lengths).amax(dim=-1)  # 0 where no B fits

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        T = self.seq_len
        B = self.block_length_of(tokens)[:, None]  # (n, 1)
        # Scored: t in the second copy (t >= T - B, i.e. B >= T - t) whose next token is inside
        # it (t <= T - 2); B = 0 (no block) scores nothing. One comparison with the smallest
        # B that scores each t (T + 1, more than any B, at the last position).
        smallest = torch.tensor([T - t for t in range(T - 1)] + [T + 1], device=tokens.device)
        mask = smallest <= B  # (n, pos)
        next_token = torch.roll(tokens, -1, dims=-1)  # (n, pos): tokens[t + 1] (wraps at end)
        return next_token, mask & padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {
            "induction": induction_template(tokens, padding_mask),
            "previous": previous_token_template(tokens, padding_mask),
        }


class MultiRelationTask(Task):
    """Three targets at every position at once, ``target_names = ["previous", "mirror",
    "count_previous"]``: the previous token (class ``d_vocab`` at ``t = 0``), the mirrored token
    ``tokens[L - 1 - t]``, and the number of earlier copies of the token at ``t``. Targets are
    ``[n, pos, 3]`` with ``d_vocab_out = max(d_vocab + 1, seq_len)``. Each target is solved by
    its own relation, ``previous``, ``mirror`` and ``same_token_upto`` (the copies up to and
    including the query, whose row sum is the count + 1), which gives the heads a reason to
    divide the work. Bidirectional.

    Example:
        >>> MultiRelationTask(seq_len=3, d_vocab=4).targets_for(
        ...     torch.tensor([[2, 2, 1]]))[0].tolist()
        [[[4, 1, 0], [2, 2, 1], [2, 2, 0]]]
    """

    name = "multi_relation"
    causal = False

    @property
    def d_vocab_out(self) -> int:
        return max(self.d_vocab + 1, self.seq_len)

    @property
    def n_targets(self) -> int:
        return 3

    @property
    def target_names(self) -> list[str]:
        return ["previous", "mirror", "count_previous"]

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        targets = torch.stack(
            [
                _previous(tokens, first=self.d_vocab),
                _mirror(tokens, padding_mask),
                _count_previous(tokens),
            ],
            dim=-1,
        )  # (n, pos, 3)
        return targets, padding_mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> Relations:
        return {
            "previous": previous_token_template(tokens, padding_mask),
            "mirror": mirror_template(tokens, padding_mask),
            "same_token_upto": same_token_template(tokens, padding_mask, up_to_self=True),
        }


BUILTIN_TASKS: tuple[type[Task], ...] = (
    CountPreviousTask,
    ReverseTask,
    HistogramTask,
    PreviousTokenTask,
    SortTask,
    InductionTask,
    MultiRelationTask,
)
