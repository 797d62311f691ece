"""Models with hand-set weights whose heads are known: the toolkit's ground truth.

Analyses are tested on these before they are trusted on trained models: a previous-token head
must be found as one, two identical heads must come out most similar, removing a head whose
output nobody reads must change nothing.

Residual-stream layout (one-hot features, so every head's job is exact)::

    [0, V)              current token       (token embedding)
    [V, V+T)            position            (positional embedding)
    [V+T, V+T+V)        "copied token"      (written by token-copying heads, read by unembed)
    rest                unused

With ``T = seq_len`` and ``V = d_vocab``. ``d_model = n_heads * d_head`` must hold the first three
blocks and ``d_head`` must be at least ``max(T, V)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.runtime import resolve_device
from mhainterp.validation import invalid

__all__ = ["HEAD_KINDS", "feature_model", "handbuilt_model"]

# kind -> (query position q attends key position k) rule; None = no QK (uniform) or no output.
HEAD_KINDS = ("previous", "mirror", "self", "first", "uniform", "dead", "count", "count_sink")
_COUNTING_KINDS = ("count", "count_sink")
_COPYING_KINDS = ("previous", "mirror", "self", "first")


def feature_model(cfg: ModelConfig) -> tuple[HookedMHATransformer, tuple[slice, slice, slice]]:
    """A model with every weight 0 but one-hot token and position embeddings.

    The residual stream is laid out as ``[token one-hot (V) | position one-hot (T) | copy
    slot (V) | ...]``; the returned slices name those features, so hand-set heads can read a
    token or a position and write into the copy slot.
    """
    V, T = cfg.d_vocab, cfg.n_ctx
    model = HookedMHATransformer(cfg)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.weight[:, :V] = torch.eye(V)
        model.pos_embed.weight[:, V : V + T] = torch.eye(T)
    return model, (slice(0, V), slice(V, V + T), slice(V + T, V + T + V))


def placed(model: HookedMHATransformer, device: str | torch.device | None) -> HookedMHATransformer:
    """``model`` (its weights set by hand on the CPU) on ``device``, in evaluation mode: what
    every hand-set builder returns (None: :func:`~mhainterp.runtime.resolve_device` decides).

    Example:
        >>> model, _ = feature_model(ModelConfig(d_model=32, n_ctx=4, device="cpu"))
        >>> placed(model, "meta").cfg.device
        'meta'
    """
    return model.to(resolve_device(device)).eval()


def _key_for_query(kind: str, q: int, seq_len: int) -> int | None:
    if kind == "previous":
        return q - 1 if q >= 1 else None
    if kind == "mirror":
        return seq_len - 1 - q
    if kind == "self":
        return q
    if kind == "first":
        return 0
    return None


def handbuilt_model(
    kinds: Sequence[str],
    *,
    seq_len: int = 16,
    d_vocab: int = 10,
    d_head: int = 16,
    causal: bool = True,
    sharpness: float = 30.0,
    copy_weights: Sequence[float] | None = None,
    uniform_weight: float = 0.3,
    device: str | torch.device | None = None,
) -> HookedMHATransformer:
    """A one-layer attention-only model whose head ``i`` does exactly ``kinds[i]``.

    Kinds: ``"previous"`` (attend to q-1 and copy its token), ``"mirror"`` (attend to T-1-q,
    copy), ``"self"``, ``"first"`` (attend to position 0, copy), ``"uniform"`` (equal weight on
    every visible key; writes ``uniform_weight`` x the average visible token into the copy
    block), ``"dead"`` (all weights zero: writes nothing), ``"count"`` (equal weight on every
    visible key holding the query's token, the query itself included: in a causal model the
    set ``same_token_upto`` a counting head spreads over), ``"count_sink"`` (the same plus the
    first position as a sink; uniform over set and sink when position 0 holds a token no later
    position holds, a BOS, else position 0 gets the weight of two keys). Counting heads write
    like ``uniform`` heads. Repeat a kind to get identical heads.

    The unembedding reads class ``c < V`` from the copy block and the extra class ``V`` from
    position 0, so on ``previous_token`` (fixed class ``V`` at t=0) a model with a previous head
    is exact, and on ``reverse`` a model with a mirror head is exact.

    Args:
        kinds: One kind per head.
        seq_len: ``n_ctx`` (T).
        d_vocab: Number of tokens (V); the model outputs V + 1 classes.
        d_head: Width of each head (>= max(T, V)).
        causal: Causal masking (``mirror`` needs ``causal=False``).
        sharpness: Attention logit of the intended key (others get 0); 30 gives > 0.999 weight.
        copy_weights: Output scale of each copying head; default 1 / (number of copying heads),
            so identical heads share the work and each alone still decides the argmax.
        uniform_weight: Output scale of each uniform head.
        device: Where the model goes once its weights are set (on the CPU, exactly): None
            (decided by :func:`mhainterp.runtime.resolve_device`), ``"cpu"``, ``"cuda"``,
            ... or ``"meta"`` (shapes only).

    Example:
        >>> model = handbuilt_model(["previous", "uniform", "previous"], d_head=16)
        >>> model.cfg.n_heads, model.cfg.d_model
        (3, 48)
    """
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in HEAD_KINDS]
    if d_head < max(seq_len, d_vocab + 1) and any(k == "count_sink" for k in kinds):
        raise invalid("d_head", d_head, f">= d_vocab + 1 = {d_vocab + 1} for a 'count_sink' head")
    if not kinds or unknown:
        raise invalid("kinds", kinds, "a non-empty list of " + ", ".join(map(repr, HEAD_KINDS)))
    if "mirror" in kinds and causal:
        raise invalid("causal", causal, "False with a 'mirror' head (it looks at later positions)")
    n_heads, T, V = len(kinds), seq_len, d_vocab
    if d_head < max(T, V):
        raise invalid("d_head", d_head, f">= max(seq_len, d_vocab) = {max(T, V)}")
    d_model = n_heads * d_head
    if d_model < 2 * V + T:
        raise invalid(
            "d_head",
            d_head,
            f"large enough that d_model = n_heads * d_head (now {d_model}) >= 2 * d_vocab + "
            f"seq_len = {2 * V + T} (the feature layout)",
        )
    n_copying = sum(k in _COPYING_KINDS for k in kinds)
    if copy_weights is None:
        copy_weights = [1.0 / max(1, n_copying)] * n_heads
    if len(copy_weights) != n_heads:
        raise invalid("copy_weights", copy_weights, f"{n_heads} numbers, one per head")

    cfg = ModelConfig(
        d_model=d_model,
        n_heads=n_heads,
        n_layers=1,
        n_ctx=T,
        d_vocab=V,
        d_vocab_out=V + 1,
        causal=causal,
        attn_only=True,
        normalization_type=None,
        device="cpu",  # weights set by hand on the CPU; .to(device) moves the model
    )
    model, (tok, pos, copy) = feature_model(cfg)
    attn = model.blocks[0].attn
    scale = sharpness * d_head**0.5  # undo the 1/sqrt(d_head) score scaling

    with torch.no_grad():
        W_Q = torch.zeros(n_heads, d_model, d_head)
        W_K = torch.zeros(n_heads, d_model, d_head)
        W_V = torch.zeros(n_heads, d_model, d_head)
        W_O = torch.zeros(n_heads, d_head, d_model)
        b_Q = torch.zeros(n_heads, d_head)
        for h, kind in enumerate(kinds):
            if kind == "dead":
                continue
            if kind in _COUNTING_KINDS:
                # QK on tokens: score = scale where the key holds the query's token.
                W_Q[h, tok, :V] = scale * torch.eye(V)
                W_K[h, tok, :V] = torch.eye(V)
                if kind == "count_sink":  # every query also scores position 0 (dim V)
                    b_Q[h, V] = scale
                    W_K[h, V + 0, V] = 1.0
                W_V[h, tok, :V] = torch.eye(V)
                W_O[h, :V, copy] = uniform_weight * torch.eye(V)
                continue
            # QK on positions: query q's vector is scale * e_{key(q)}, key k's vector is e_k.
            for q in range(T):
                k = _key_for_query(kind, q, T)
                if k is not None:
                    W_Q[h, V + q, k] = scale
            W_K[h, pos, :T] = torch.eye(T)
            # OV: copy the attended token into the copy block.
            W_V[h, tok, :V] = torch.eye(V)
            weight = uniform_weight if kind == "uniform" else copy_weights[h]
            W_O[h, :V, copy] = weight * torch.eye(V)
        attn.W_Q, attn.W_K, attn.W_V, attn.W_O = W_Q, W_K, W_V, W_O
        attn.b_Q = b_Q
        # Unembed: class c < V reads the copy block; class V ("no previous token") reads pos 0.
        logit_scale = 20.0
        model.unembed.weight[:V, copy] = logit_scale * torch.eye(V)
        model.unembed.weight[V, V + 0] = 2 * logit_scale
    return placed(model, device)
