"""The data of the hand-set heads that divide the work
(:mod:`mhainterp.model.handbuilt.split`): the division-of-labour tests' ground-truth batches.

It lives with the tasks, not with the model, because it is a :class:`~mhainterp.tasks.Batch`:
the model package sits below the tasks and imports none of them.

Example:
    >>> from mhainterp.model.handbuilt import split_heads_model
    >>> model = split_heads_model([("target", [0, 1, 2, 3]), ("target", [4, 5, 6, 7, 8])])
    >>> batch = split_batch(64)
    >>> bool((model(batch.tokens).argmax(-1) == batch.targets)[batch.mask].all())
    True
"""

from __future__ import annotations

import torch

from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.tasks.batch import Batch
from mhainterp.validation import check_int

__all__ = ["split_batch"]


def split_batch(n: int, *, seq_len: int = 12, d_vocab: int = 10, seed: int = 0) -> Batch:
    """``n`` sequences ``[BOS, x_1, ..., x_{T-1}]`` with target ``tokens[t - 1]`` from ``t = 2``:
    position 0 holds the BOS token ``d_vocab - 1``, positions ``1..`` random tokens
    ``0 .. d_vocab - 2``.

    Example:
        >>> b = split_batch(2, seq_len=4)
        >>> b.tokens[:, 0].tolist(), b.mask[0].tolist()
        ([9, 9], [False, False, True, True])
    """
    n = check_int("n", n, minimum=1)
    generator = torch.Generator().manual_seed(seed)
    bos = d_vocab - 1
    tokens = torch.randint(0, bos, (n, seq_len), generator=generator)
    tokens[:, 0] = bos
    mask = torch.zeros(n, seq_len, dtype=torch.bool)
    mask[:, 2:] = True
    targets = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long)
    targets[:, 1:] = tokens[:, :-1]
    targets[~mask] = IGNORE_INDEX
    return Batch(tokens, targets, mask, torch.ones_like(mask))
