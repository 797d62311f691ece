"""THE reference model: a hookable multi-head attention transformer in TransformerLens's layout.

==================  ========================================================================
``transformer``     :class:`HookedMHATransformer`: embed -> blocks -> per-position class
                    logits, the one readable forward (shapes as comments)
``components``      the layers: attention, MLP, LayerNorm, block, unembedding
``weight_views``    TransformerLens-layout weight views (``W_Q``, ``QK``, ``OV``, ...)
``hooks``           :class:`StopForward`: end a forward pass early, from a hook
``handbuilt``       models with hand-set heads, the tests' ground truth (not imported here)
==================  ========================================================================

The fast paths in :mod:`mhainterp.fast` are derived copies of this forward, each tested equal to
it; a change here names them in its commit.

Hook names, shapes and values are TransformerLens's (``tests/test_tl_parity.py`` compares every
hook with TransformerLens 4's own model: maximum difference 0.0). The intentional differences:

- **padding**: an explicit ``padding_mask=`` (``[batch, pos]``, True = real token); padded keys
  are masked in every head, causal and bidirectional; padding is at the end only (TL derives
  the mask from a tokenizer's pad token). Variable-length tasks need it: no query may read
  padding, and positions keep their meaning.
- **tokens**: no tokenizer; ``to_tokens`` reads integer ids (``"1 2 3"``, lists); no BOS (a BOS
  would shift the positions the task's relations refer to); rows of different lengths are an
  error.
- **outputs**: per-position class logits (``d_vocab_out`` may differ from ``d_vocab``); with
  ``n_targets > 1`` logits are ``[batch, pos, target, class]`` and ``W_U``'s columns run target
  by target.
- **hook_attn_scores**: pre-softmax scores, ``-inf`` where masked (``HookedTransformer``'s
  definition; TL 4.3's native bridge fires the softmaxed weights there).
- **hook_normalized**: the centred input divided by ``hook_scale``, before weight and bias
  (TransformerLens 4.x's and ``LayerNormPre``'s definition), which ``apply_ln=True`` divides by.
- **weight processing**: none on load (no ``fold_ln``, ``center_writing_weights``): analyses
  read the model that was trained.
- **per-head inputs**: ln1's hooks fire once on the shared residual (``[batch, pos, 1]``), as the
  4.x bridge does.
- **scope**: no bridge wrapper hooks, ``hook_tokens``, KV cache, generation or rotary
  embeddings: one learned positional embedding, fixed-length contexts.

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``heads``, ``runtime``, ``validation``.
"""

from mhainterp.model.components import (
    LayerNorm,
    MultiHeadAttention,
    TransformerBlock,
    merge_heads,
    split_heads,
)
from mhainterp.model.hooks import StopForward
from mhainterp.model.transformer import HookedMHATransformer

__all__ = [
    "HookedMHATransformer",
    "LayerNorm",
    "MultiHeadAttention",
    "StopForward",
    "TransformerBlock",
    "merge_heads",
    "split_heads",
]
