"""Hand-set heads that divide the work: the ground truth of the division-of-labour tests.

Every head is a previous-token head (query ``q`` attends to key ``q - 1`` and copies its token
into the copy block that the unembedding reads), restricted in one of three ways:

``("all", None)``
    copies every token: a plain previous-token head;
``("target", S)``
    copies only tokens in ``S``, so removing it loses exactly the positions whose *target class*
    (the previous token) is in ``S``;
``("query", S)``
    acts only at queries whose *own token* is in ``S``; at other queries it attends to the
    beginning-of-sequence token at position 0, whose value is zero, and writes nothing;
``("position", S)``
    acts only at query *positions* in ``S`` (at the others it attends to the BOS token).

Repeating a head gives copies that back each other up: each writes the full answer, so
removing one of two costs nothing and removing both costs everything it served. With
``n_layers`` > 1 every layer holds the same heads, reading only the token and position
features (never what an earlier layer wrote): each layer alone does the whole job, so the layers
back each other up (the cross-layer case of the division's kept profiles).

The data is :func:`mhainterp.tasks.split_batch`: position 0 holds the BOS token ``d_vocab - 1``,
positions ``1..`` random tokens ``0 .. d_vocab - 2``, the target at ``t`` is ``tokens[t - 1]``,
scored from ``t = 2`` on. When no head writes, the unembedding's bias makes the never-correct BOS
class win, so with zero ablation a removed head's damage is exactly 1 on the values it serves and 0
elsewhere. Residual layout as :mod:`mhainterp.model.handbuilt.relations`: token, position, copy
blocks.

Example:
    >>> model = split_heads_model([("target", [0, 1, 2, 3]), ("target", [4, 5, 6, 7, 8])])
    >>> from mhainterp.tasks import split_batch
    >>> batch = split_batch(64)
    >>> bool((model(batch.tokens).argmax(-1) == batch.targets)[batch.mask].all())
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt.relations import feature_model, placed
from mhainterp.validation import check_int, invalid

__all__ = ["SPLIT_KINDS", "head_copies_model", "split_heads_model"]

SPLIT_KINDS = ("all", "target", "query", "position")


def split_heads_model(
    heads: Sequence[tuple[str, Sequence[int] | None]],
    *,
    seq_len: int = 12,
    d_vocab: int = 10,
    d_head: int = 16,
    sharpness: float = 30.0,
    n_layers: int = 1,
    device: str | torch.device | None = None,
) -> HookedMHATransformer:
    """An attention-only causal model; head ``i`` of every layer is ``heads[i] = (kind, set)``.

    Args:
        heads: ``("all", None)``, ``("target", tokens)``, ``("query", tokens)`` or
            ``("position", positions)`` per head (see the module docstring).
        seq_len: ``n_ctx``.
        d_vocab: Tokens including the BOS token ``d_vocab - 1``; also the output classes.
        d_head: Head width (>= ``max(seq_len, d_vocab)``).
        sharpness: Attention logit of the intended key; 30 gives > 0.999 weight.
        n_layers: Layers, each holding ``heads`` (each layer alone does the whole job).
        device: Where the model goes once its weights are set (on the CPU, exactly): None
            (decided by :func:`mhainterp.runtime.resolve_device`), ``"cpu"``, ``"cuda"``,
            ... or ``"meta"`` (shapes only).

    Example:
        >>> split_heads_model([("query", [0, 1]), ("all", None)]).cfg.n_heads
        2
        >>> same_job = split_heads_model([("all", None)] * 2, n_layers=2)
        >>> same_job.cfg.n_layers, same_job.head_labels
        (2, ['L0H0', 'L0H1', 'L1H0', 'L1H1'])
    """
    heads = list(heads)
    if not heads or any(kind not in SPLIT_KINDS for kind, _ in heads):
        raise invalid("heads", heads, f"(kind, set) pairs with kind in {SPLIT_KINDS}")
    n_heads, T, V = len(heads), seq_len, d_vocab
    n_layers = check_int("n_layers", n_layers, minimum=1)
    bos = V - 1
    d_model = n_heads * d_head
    if d_head < max(T, V) or d_model < 2 * V + T:
        raise invalid("d_head", d_head, f">= {max(T, V)} and n_heads * d_head >= {2 * V + T}")
    cfg = ModelConfig(
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
        n_ctx=T,
        d_vocab=V,
        d_vocab_out=V,
        causal=True,
        attn_only=True,
        normalization_type=None,
        device="cpu",  # weights set by hand on the CPU; .to(device) moves the model
    )
    model, (_, pos, copy) = feature_model(cfg)
    scale = sharpness * d_head**0.5  # undo the 1/sqrt(d_head) score scaling
    with torch.no_grad():
        W_Q = torch.zeros(n_heads, d_model, d_head)
        W_K = torch.zeros(n_heads, d_model, d_head)
        W_V = torch.zeros(n_heads, d_model, d_head)
        W_O = torch.zeros(n_heads, d_head, d_model)
        for h, (kind, members) in enumerate(heads):
            for q in range(1, T):
                W_Q[h, V + q, q - 1] = scale  # query q looks at key q - 1
            W_K[h, pos, :T] = torch.eye(T)
            copied = set(range(bos)) if kind != "target" else set(members or ())
            for v in copied - {bos}:
                W_V[h, v, v] = 1.0  # copy the attended token (BOS's value stays zero)
            if kind == "query":
                for v in set(range(V)) - set(members or ()):
                    W_Q[h, v, 0] = 2 * scale  # other query tokens look at BOS instead
            if kind == "position":
                for q in set(range(T)) - set(members or ()):
                    W_Q[h, V + q, 0] += 2 * scale  # other query positions look at BOS
            W_O[h, :V, copy] = torch.eye(V)
        for block in model.blocks:  # every layer the same heads
            attn = block.attn
            attn.W_Q, attn.W_K, attn.W_V, attn.W_O = (w.clone() for w in (W_Q, W_K, W_V, W_O))
        model.unembed.weight[:V, copy] = 20.0 * torch.eye(V)
        model.unembed.bias[bos] = 1.0  # nothing written -> the never-correct BOS class wins
    return placed(model, device)


def head_copies_model(
    model: HookedMHATransformer, source: int, noise: float = 0.0, *, seed: int = 0
) -> HookedMHATransformer:
    """A copy of a one-layer ``model`` whose every head is head ``source`` (plus relative
    Gaussian noise ``noise`` x the RMS of each matrix, drawn per copy), each writing ``1 / h``
    of it: h heads doing one job, the null case of the division test.

    Example:
        >>> m = split_heads_model([("all", None), ("target", [1])])
        >>> c = head_copies_model(m, 0)
        >>> torch.equal(c.blocks[0].attn.W_V[0], c.blocks[0].attn.W_V[1])
        True
    """
    import copy

    twin = copy.deepcopy(model)
    attn = twin.blocks[0].attn
    generator = torch.Generator().manual_seed(seed)
    h = twin.cfg.n_heads
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            weight = getattr(attn, name).detach().clone()  # (h, ...)
            one = weight[source]
            rms = one.pow(2).mean().sqrt()
            copies = one[None].repeat(h, *([1] * one.ndim))
            draw = torch.randn(copies.shape, generator=generator)  # on the CPU: any device
            copies = copies + noise * rms * draw.to(copies.device)
            if name == "W_O":
                copies = copies / h
            setattr(attn, name, copies)
    return twin.eval()
