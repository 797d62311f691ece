"""The built-in tasks. Each docstring says what the target is and which relation solves it.

Shapes: n sequences, pos positions, q/k query/key positions; ``L`` is a sequence's real length.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.tasks.base import Task
from mhainterp.tasks.templates import (
    induction_template,
    mirror_template,
    previous_token_template,
    same_token_template,
    sort_source_template,
)

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
    """How many earlier positions hold the same token (padding sits after, so never counted)."""
    counts = torch.zeros_like(tokens)
    for t in range(1, tokens.shape[1]):
        counts[:, t] = (tokens[:, :t] == tokens[:, t : t + 1]).sum(-1)
    return counts


def _mirror(
    tokens: Int[Tensor, "n pos"], padding_mask: Bool[Tensor, "n pos"]
) -> Int[Tensor, "n pos"]:
    """``tokens[L - 1 - t]`` (clamped to 0 at padding positions, which are masked anyway)."""
    lengths = padding_mask.sum(-1, keepdim=True)  # (n, 1)
    source = (lengths - 1 - torch.arange(tokens.shape[1], device=tokens.device)).clamp(min=0)
    return tokens.gather(-1, source)


def _previous(tokens: Int[Tensor, "n pos"], first: int) -> Int[Tensor, "n pos"]:
    """``tokens[t - 1]``, and the class ``first`` at ``t = 0``."""
    return torch.cat([torch.full_like(tokens[:, :1], first), tokens[:, :-1]], dim=-1)


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
        per_value = torch.zeros(tokens.shape[0], self.d_vocab + 1, dtype=torch.int64)
        per_value = per_value.to(tokens.device).scatter_add_(1, binned, torch.ones_like(binned))
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
    """Induction: a random block of ``B = seq_len // 2`` tokens followed by the same block again
    (after one random prefix token when ``seq_len`` is odd). At each position ``t`` of the second
    copy whose next token is still inside it, the target is that next token ``tokens[t + 1]``;
    other positions are not scored (``d_vocab_out = d_vocab``). Solved by a two-layer circuit:
    a ``previous``-token head, then an ``induction`` head attending to the token after the
    earlier copy of the current token (``k = t - B + 1``). The block is drawn without
    replacement when ``d_vocab >= B`` and the prefix token then differs from the block when
    ``d_vocab > B``, so that key is the only one; otherwise tokens repeat and the ``induction``
    template marks every token that follows an earlier copy. Causal; fixed length only.

    Example:
        >>> InductionTask(seq_len=6).targets_for(torch.tensor([[5, 6, 7, 5, 6, 7]]))[0].tolist()
        [[-100, -100, -100, 6, 7, -100]]
    """

    name = "induction"
    causal = True
    min_layers = 2

    def __init__(self, seq_len: int = 16, d_vocab: int = 10, min_len: int | None = None) -> None:
        super().__init__(seq_len=seq_len, d_vocab=d_vocab, min_len=min_len)
        if self.seq_len < 4:
            raise ValueError(
                f"seq_len={seq_len!r} is invalid for induction: must be >= 4 (a block of at "
                f"least 2 tokens, repeated, so at least one position is scored)."
            )
        if self.min_len != self.seq_len:
            raise ValueError(
                f"min_len={min_len!r} is invalid for induction: variable length does not apply "
                f"(the block and its repeat fill the sequence); leave min_len unset or equal to "
                f"seq_len={self.seq_len}."
            )

    @property
    def block_len(self) -> int:
        """``B``, the length of the repeated block."""
        return self.seq_len // 2

    @property
    def prefix_len(self) -> int:
        """1 when ``seq_len`` is odd (one random token before the block), else 0."""
        return self.seq_len % 2

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    def sample_tokens(self, n: int, lengths: Tensor, generator: torch.Generator | None) -> Tensor:
        B, s, V = self.block_len, self.prefix_len, self.d_vocab
        prefix = torch.zeros(n, 0, dtype=torch.int64)
        if V >= B:  # without replacement: the first B (+ 1) values of a random permutation
            perm = torch.rand(n, V, generator=generator).argsort(dim=-1)  # (n, V)
            block = perm[:, :B]
            prefix = perm[:, B : B + s]  # differs from the block; empty when V == B
        else:
            block = torch.randint(0, V, (n, B), generator=generator)
        if prefix.shape[1] < s:
            prefix = torch.randint(0, V, (n, 1), generator=generator)
        return torch.cat([prefix, block, block], dim=-1)  # (n, s + 2B)

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> Targets:
        first_repeat = self.prefix_len + self.block_len  # first position of the second copy
        pos = torch.arange(self.seq_len, device=tokens.device)
        mask = (pos >= first_repeat) & (pos <= self.seq_len - 2)  # next token inside the repeat
        next_token = torch.roll(tokens, -1, dims=-1)  # (n, pos): tokens[t + 1] (wraps at end)
        return next_token, mask[None, :] & padding_mask

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
