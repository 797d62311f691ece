"""TransformerLens-layout views of the model's weights, as mixins of the modules that own them.

The weights live in fused ``nn.Linear`` / ``nn.Embedding`` modules (their names are the
state_dict keys of saved runs); these mixins only add TransformerLens's names and layouts on top:

- :class:`AttentionWeightViews` (mixed into :class:`~mhainterp.model.MultiHeadAttention`):
  per-head ``W_Q, W_K, W_V: [h, d_model, d_head]``, ``W_O: [h, d_head, d_model]``,
  ``b_Q, b_K, b_V: [h, d_head]``, ``b_O: [d_model]``, and the ``QK`` / ``OV`` circuits.
  Assigning to a view (``attn.W_Q = w``) writes through into the fused weight, which is how
  tests and :mod:`mhainterp.model.handbuilt` build models with hand-set heads.
- :class:`ModelWeightViews` (mixed into :class:`~mhainterp.model.HookedMHATransformer`): the
  same views stacked over layers (``W_Q: [n_layers, h, d_model, d_head]``, ...), ``W_in`` ...
  ``b_out`` of the MLPs, ``W_E, W_pos, W_E_pos, W_U, b_U``, and the labels of the
  ``[n_layers, h]`` axes (``head_labels`` / ``all_head_labels``).

The mixins hold no state and create no parameters, so they change neither the parameter names
nor the order in which parameters are created and initialised.

Example:
    >>> from mhainterp.config import ModelConfig
    >>> from mhainterp.model.transformer import HookedMHATransformer
    >>> model = HookedMHATransformer(ModelConfig(d_model=8, n_heads=2, n_ctx=4, d_vocab=5))
    >>> model.W_Q.shape, model.blocks[0].attn.OV.shape
    (torch.Size([1, 2, 8, 4]), torch.Size([2, 8, 8]))
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import FactoredMatrix

from mhainterp.config import ModelConfig
from mhainterp.heads import all_head_labels
from mhainterp.validation import ParameterError

__all__ = ["AttentionWeightViews", "ModelWeightViews"]


class AttentionWeightViews:
    """Per-head views of one attention layer's fused Q, K, V, O projections (a mixin).

    Expects ``cfg``, ``n_heads``, ``d_head`` and the ``nn.Linear`` modules ``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj`` (``d_model x d_model``, bias included).
    """

    cfg: ModelConfig
    n_heads: int
    d_head: int
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear

    def _in_view(self, linear: nn.Linear) -> Float[Tensor, "h d_model d_head"]:
        # linear computes x @ weight.T; the columns of weight.T are grouped head by head.
        return linear.weight.T.reshape(self.cfg.d_model, self.n_heads, self.d_head).permute(1, 0, 2)

    def _set_in_view(self, linear: nn.Linear, value: Tensor) -> None:
        expected = (self.n_heads, self.cfg.d_model, self.d_head)
        _check_shape(value, expected, "W_Q/W_K/W_V")
        with torch.no_grad():
            linear.weight.copy_(value.permute(1, 0, 2).reshape(self.cfg.d_model, -1).T)

    def _set_bias_view(self, linear: nn.Linear, value: Tensor) -> None:
        _check_shape(value, (self.n_heads, self.d_head), "b_Q/b_K/b_V")
        with torch.no_grad():
            linear.bias.copy_(value.reshape(-1))

    @property
    def W_Q(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.q_proj)

    @W_Q.setter
    def W_Q(self, value: Tensor) -> None:
        self._set_in_view(self.q_proj, value)

    @property
    def W_K(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.k_proj)

    @W_K.setter
    def W_K(self, value: Tensor) -> None:
        self._set_in_view(self.k_proj, value)

    @property
    def W_V(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.v_proj)

    @W_V.setter
    def W_V(self, value: Tensor) -> None:
        self._set_in_view(self.v_proj, value)

    @property
    def W_O(self) -> Float[Tensor, "h d_head d_model"]:
        return self.o_proj.weight.T.reshape(self.n_heads, self.d_head, self.cfg.d_model)

    @W_O.setter
    def W_O(self, value: Tensor) -> None:
        _check_shape(value, (self.n_heads, self.d_head, self.cfg.d_model), "W_O")
        with torch.no_grad():
            self.o_proj.weight.copy_(value.reshape(-1, self.cfg.d_model).T)

    @property
    def b_Q(self) -> Float[Tensor, "h d_head"]:
        return self.q_proj.bias.reshape(self.n_heads, self.d_head)

    @b_Q.setter
    def b_Q(self, value: Tensor) -> None:
        self._set_bias_view(self.q_proj, value)

    @property
    def b_K(self) -> Float[Tensor, "h d_head"]:
        return self.k_proj.bias.reshape(self.n_heads, self.d_head)

    @b_K.setter
    def b_K(self, value: Tensor) -> None:
        self._set_bias_view(self.k_proj, value)

    @property
    def b_V(self) -> Float[Tensor, "h d_head"]:
        return self.v_proj.bias.reshape(self.n_heads, self.d_head)

    @b_V.setter
    def b_V(self, value: Tensor) -> None:
        self._set_bias_view(self.v_proj, value)

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        return self.o_proj.bias

    @b_O.setter
    def b_O(self, value: Tensor) -> None:
        _check_shape(value, (self.cfg.d_model,), "b_O")
        with torch.no_grad():
            self.o_proj.bias.copy_(value)

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` per head, ``[h, d_model, d_model]`` (a ``FactoredMatrix``)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per head, ``[h, d_model, d_model]`` (a ``FactoredMatrix``)."""
        return FactoredMatrix(self.W_V, self.W_O)


def _check_shape(value: Tensor, expected: tuple[int, ...], name: str) -> None:
    if not isinstance(value, Tensor) or tuple(value.shape) != expected:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ParameterError(f"{name} is invalid: a tensor of shape {expected}, got {got}")


class ModelWeightViews:
    """Whole-model TransformerLens-layout views, stacked over layers (a mixin).

    Expects ``cfg``, the embeddings ``embed`` / ``pos_embed``, ``blocks`` (each with ``attn``
    and, unless ``cfg.attn_only``, ``mlp``) and the ``unembed`` linear layer.
    """

    cfg: ModelConfig
    embed: nn.Embedding
    pos_embed: nn.Embedding
    blocks: nn.ModuleList
    unembed: nn.Linear

    @property
    def head_labels(self) -> list[str]:
        """``["L0H0", "L0H1", ...]`` in layer-major order."""
        return all_head_labels(self.cfg.n_layers, self.cfg.n_heads)

    @property
    def all_head_labels(self) -> list[str]:
        """TransformerLens's name for :attr:`head_labels` (the same ``"L0H0"`` labels)."""
        return self.head_labels

    def _stack(self, name: str, part: str = "attn") -> Tensor:
        if part == "mlp" and self.cfg.attn_only:
            raise AttributeError(f"{name} is undefined: this model is attention-only (no MLP)")
        return torch.stack([getattr(getattr(block, part), name) for block in self.blocks])

    @property
    def W_Q(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "n_layers h d_head d_model"]:
        return self._stack("W_O")

    @property
    def b_Q(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_Q")

    @property
    def b_K(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_K")

    @property
    def b_V(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_V")

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_O")

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return self._stack("W_in", "mlp")

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return self._stack("b_in", "mlp")

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return self._stack("W_out", "mlp")

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_out", "mlp")

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` of every head, ``[n_layers, h, d_model, d_model]``."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` of every head, ``[n_layers, h, d_model, d_model]``."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.weight

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        """``[W_E; W_pos]`` stacked along the rows, as TransformerLens defines it."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.weight

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab_out_total"]:
        """Unembedding in TransformerLens layout (``resid @ W_U + b_U``)."""
        return self.unembed.weight.T

    @property
    def b_U(self) -> Float[Tensor, " d_vocab_out_total"]:
        return self.unembed.bias

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
