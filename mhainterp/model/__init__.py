"""THE reference model: a hookable multi-head attention transformer in TransformerLens's layout.

==================  ========================================================================
``transformer``     :class:`HookedMHATransformer`: embed -> blocks -> per-position class
                    logits, the one readable forward (shapes as comments)
``components``      the layers: attention, MLP, LayerNorm, block, unembedding
``weight_views``    TransformerLens-layout weight views (``W_Q``, ``QK``, ``OV``, ...)
==================  ========================================================================

The fast paths in :mod:`mhainterp.fast` are derived copies of this forward, each tested equal to
it; a change here names them in its commit.
"""

from mhainterp.model.components import (
    LayerNorm,
    MultiHeadAttention,
    TransformerBlock,
    merge_heads,
    split_heads,
)
from mhainterp.model.transformer import HookedMHATransformer

__all__ = [
    "HookedMHATransformer",
    "LayerNorm",
    "MultiHeadAttention",
    "TransformerBlock",
    "merge_heads",
    "split_heads",
]
