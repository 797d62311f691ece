"""Hand-set models for the ``induction`` task: the two-layer circuit, and the one-layer heads
that must fail it.

Residual-stream layout (one-hot features, so every head's job is exact)::

    [0, V)              current token       (token embedding)
    [V, V+T)            position            (positional embedding)
    [V+T, V+T+V)        "previous token"    (written by the layer-0 previous-token head)
    [V+T+V, V+T+2V)     "copied token"      (written by the copying head, read by unembed)

With ``T = seq_len`` and ``V = d_vocab``; one head per layer of width ``d_model``. The
unembedding reads class ``c`` from the copy block, so a model is right exactly where its copying
head attends to the answer's position.
"""

from __future__ import annotations

import torch

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt.relations import feature_model, placed
from mhainterp.validation import check_int

__all__ = ["induction_circuit_model", "offset_head_model"]

_SHARPNESS = 30.0  # attention logit of the intended key (others 0): > 0.999 of the weight
_LOGIT_SCALE = 20.0


def _config(n_layers: int, seq_len: int, d_vocab: int) -> ModelConfig:
    d_model = 3 * d_vocab + seq_len
    return ModelConfig(
        d_model=d_model,
        n_heads=1,
        n_layers=n_layers,
        n_ctx=seq_len,
        d_vocab=d_vocab,
        d_vocab_out=d_vocab,
        causal=True,
        attn_only=True,
        normalization_type=None,
        device="cpu",  # weights set by hand on the CPU; .to(device) moves the model
    )


def _slices(V: int, T: int) -> tuple[slice, slice, slice, slice]:
    return slice(0, V), slice(V, V + T), slice(V + T, V + T + V), slice(V + T + V, V + T + 2 * V)


def _positional_copy_head(model: HookedMHATransformer, layer: int, offset: int, out: slice):
    """Head ``layer``.0 attends from ``q`` to ``q - offset`` and writes that key's token into
    ``out`` (queries with ``q < offset`` attend uniformly and write an average)."""
    cfg = model.cfg
    V, T, d = cfg.d_vocab, cfg.n_ctx, cfg.d_head
    tok, pos, _, _ = _slices(V, T)
    scale = _SHARPNESS * d**0.5  # undo the 1 / sqrt(d_head) score scaling
    attn = model.blocks[layer].attn
    W_Q = torch.zeros(1, cfg.d_model, d)
    W_K = torch.zeros(1, cfg.d_model, d)
    W_V = torch.zeros(1, cfg.d_model, d)
    W_O = torch.zeros(1, d, cfg.d_model)
    for q in range(offset, T):
        W_Q[0, V + q, q - offset] = scale  # query q looks for the key at position q - offset
    W_K[0, pos, :T] = torch.eye(T)
    W_V[0, tok, :V] = torch.eye(V)
    W_O[0, :V, out] = torch.eye(V)
    attn.W_Q, attn.W_K, attn.W_V, attn.W_O = W_Q, W_K, W_V, W_O


def _unembed_copy_block(model: HookedMHATransformer) -> None:
    V, T = model.cfg.d_vocab, model.cfg.n_ctx
    model.unembed.weight[:V, _slices(V, T)[3]] = _LOGIT_SCALE * torch.eye(V)


def induction_circuit_model(
    seq_len: int = 16, d_vocab: int = 10, *, device: str | torch.device | None = None
) -> HookedMHATransformer:
    """Two layers, one head each: ``L0H0`` a previous-token head, ``L1H0`` an induction head.

    ``L0H0`` writes ``tokens[q - 1]`` into the previous-token block. ``L1H0``'s query is the
    current token and its key the previous-token block, so query ``t`` attends to the key whose
    previous token equals ``tokens[t]`` (K-composition), and copies that key's token: the token
    that followed the earlier copy of the current one. Exact on ``induction`` whatever the
    block length.

    Args:
        seq_len: ``n_ctx`` (T).
        d_vocab: Number of tokens (V).
        device: Where the model goes once its weights are set (on the CPU, exactly): None
            (decided by :func:`mhainterp.runtime.resolve_device`), ``"cpu"``, ``"cuda"``,
            ... or ``"meta"`` (shapes only).

    Example:
        >>> from mhainterp.tasks import get_task
        >>> from mhainterp.training import evaluate
        >>> evaluate(induction_circuit_model(), get_task("induction"), n_eval=256)["accuracy"]
        1.0
    """
    T = check_int("seq_len", seq_len, minimum=2)
    V = check_int("d_vocab", d_vocab, minimum=2)
    model, _ = feature_model(_config(2, T, V))
    tok, _, prev, copy = _slices(V, T)
    d = model.cfg.d_head
    scale = _SHARPNESS * d**0.5
    with torch.no_grad():
        _positional_copy_head(model, 0, offset=1, out=prev)
        attn = model.blocks[1].attn
        W_Q = torch.zeros(1, model.cfg.d_model, d)
        W_K = torch.zeros(1, model.cfg.d_model, d)
        W_V = torch.zeros(1, model.cfg.d_model, d)
        W_O = torch.zeros(1, d, model.cfg.d_model)
        W_Q[0, tok, :V] = scale * torch.eye(V)  # the query's token ...
        W_K[0, prev, :V] = torch.eye(V)  # ... against each key's previous token
        # Position 0 has no previous token, but L0H0 (uniform there) wrote its own token into
        # the block: every query scores key 0 down by the full logit.
        b_Q = torch.zeros(1, d)
        b_Q[0, V] = scale
        W_K[0, V + 0, V] = -1.0
        attn.b_Q = b_Q
        W_V[0, tok, :V] = torch.eye(V)
        W_O[0, :V, copy] = torch.eye(V)
        attn.W_Q, attn.W_K, attn.W_V, attn.W_O = W_Q, W_K, W_V, W_O
        _unembed_copy_block(model)
    return placed(model, device)


def offset_head_model(
    offset: int,
    seq_len: int = 16,
    d_vocab: int = 10,
    *,
    device: str | torch.device | None = None,
) -> HookedMHATransformer:
    """One layer, one head that copies the token ``offset`` positions back.

    The best a single positional head can do on ``induction``: right on the sequences whose
    block length is ``offset + 1``, wrong elsewhere.

    Args:
        offset: How far back the head looks (1 .. seq_len - 1).
        seq_len: ``n_ctx`` (T).
        d_vocab: Number of tokens (V).
        device: Where the model goes once its weights are set (on the CPU, exactly): None
            (decided by :func:`mhainterp.runtime.resolve_device`), ``"cpu"``, ``"cuda"``,
            ... or ``"meta"`` (shapes only).

    Example:
        >>> offset_head_model(3).cfg.n_layers
        1
    """
    T = check_int("seq_len", seq_len, minimum=2)
    V = check_int("d_vocab", d_vocab, minimum=2)
    offset = check_int("offset", offset, minimum=1, maximum=T - 1)
    model, _ = feature_model(_config(1, T, V))
    with torch.no_grad():
        _positional_copy_head(model, 0, offset=offset, out=_slices(V, T)[3])
        _unembed_copy_block(model)
    return placed(model, device)
