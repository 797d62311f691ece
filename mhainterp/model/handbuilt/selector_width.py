"""tracr's SelectorWidth by hand: one head that counts the tokens of a variable-length input.

tracr compiles ``SelectorWidth(Select(tokens, tokens, TRUE))`` (its ``length`` program) to one
head spread evenly over the BOS and every real token: the BOS gets ``1 / L`` of the attention
(``L`` real positions, the BOS among them), and a readout turns that share into the length.
:func:`selector_width_model` is that head alone, in a one-layer, one-head, bidirectional model:
its attention is exactly uniform over the keys the padding mask lets it see, its value reads
whether a key holds the BOS token, and the unembedding decodes the share ``x = 1 / L`` into the
class ``L``: class ``c`` has logit ``scale * (2 x / c - 1 / c**2)``, which is
``scale * (x**2 - (x - 1/c)**2)``, largest at the ``c`` nearest ``1 / x``. Removing the head
leaves no length at all.

Residual layout: dimension 0 is "this position holds the BOS", dimension 1 the head's write
(the BOS share); every other weight is 0.

Example:
    >>> import torch
    >>> model = selector_width_model(seq_len=6, d_vocab=8)
    >>> tokens = torch.tensor([[0, 3, 4, 5, 7, 7]])  # BOS, three tokens, two pads (id 7)
    >>> mask = tokens != 7
    >>> model(tokens, padding_mask=mask).argmax(-1)[0, :4].tolist()
    [4, 4, 4, 4]
"""

from __future__ import annotations

import torch

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt.relations import placed
from mhainterp.validation import check_int

__all__ = ["selector_width_model"]


def selector_width_model(
    *,
    seq_len: int = 8,
    d_vocab: int = 10,
    bos: int = 0,
    d_model: int = 16,
    scale: float = 2000.0,
    device: str | torch.device | None = None,
) -> HookedMHATransformer:
    """A one-head model whose head counts every real token, the BOS included (see the module
    docstring); its output at every real position is the sequence's real length ``L``
    (classes ``0 .. seq_len``; class 0 never wins).

    Args:
        seq_len: ``n_ctx``.
        d_vocab: The model's input vocabulary (a padded task's ``d_vocab_in``).
        bos: The BOS token id.
        d_model: Residual width (= ``d_head``: one head); at least 2.
        scale: Logit scale of the readout (the gap between neighbouring lengths
            ``1 / L`` and ``1 / (L + 1)`` times ``scale`` decides the margin).
        device: Where the model goes once its weights are set (on the CPU, exactly): None
            (decided by :func:`mhainterp.runtime.resolve_device`), ``"cpu"``, ``"cuda"``,
            ... or ``"meta"`` (shapes only).
    """
    T = check_int("seq_len", seq_len, minimum=2)
    V = check_int("d_vocab", d_vocab, minimum=2)
    check_int("bos", bos, minimum=0, maximum=V - 1)
    check_int("d_model", d_model, minimum=2)
    cfg = ModelConfig(
        d_model=d_model,
        n_heads=1,
        n_layers=1,
        n_ctx=T,
        d_vocab=V,
        d_vocab_out=T + 1,
        causal=False,
        attn_only=True,
        normalization_type=None,
        device="cpu",  # weights set by hand on the CPU; .to(device) moves the model
    )
    model = HookedMHATransformer(cfg)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.weight[bos, 0] = 1.0  # "holds the BOS"
        attn = model.blocks[0].attn
        W_V, W_O = torch.zeros_like(attn.W_V), torch.zeros_like(attn.W_O)
        W_V[0, 0, 0] = 1.0  # QK stays 0: uniform over the visible keys
        W_O[0, 0, 1] = 1.0  # writes the BOS's share, 1 / L
        attn.W_V, attn.W_O = W_V, W_O
        lengths = torch.arange(1, T + 1, dtype=torch.float32)
        model.unembed.weight[1:, 1] = 2.0 * scale / lengths
        model.unembed.bias[1:] = -scale / lengths**2
        model.unembed.bias[0] = -2.0 * scale  # length 0 does not occur
    return placed(model, device)
