"""The largest activations of a stacked CPU step, written into buffers kept from step to step.

On a CPU a fresh tensor of a few MiB is not free: glibc hands a freed block back to the kernel
once enough lies free at the top of its heap, and every block of 32 MiB or more is mapped
anew, so each step's activations are page-faulted and zeroed by the kernel again before the
op that writes them runs (measured on the 2-core benchmark machine: a fresh 14 MiB tensor
filled in 3 ms, the same buffer reused in 1.2 ms; 42 MiB in 60 ms against 4.5 ms). At
27 models of batch 128, layer 0's gathers, its attention core and the output projections
made over a dozen such tensors a step. The three autograd functions here compute exactly what
the plain ops compute (the same kernels on the same shapes, each value rounded once, as
:mod:`~mhainterp.fast.stacked_forward` and autograd would), into :class:`Workspace` buffers,
with the plain ops' backward written out: :class:`GatherRows` (``index_select``),
:class:`Attention` (the unpadded attention core of every head-count group) and
:class:`Linear` (a projection, and the residual add after it).

A buffer is overwritten by the next step that uses the workspace: only a caller that is done
with a step's outputs before the next (the training step) passes one
(``tests/test_stacked_bitwise.py`` pins the bits against the plain ops).

Shapes: M models, B batch, T positions, d d_model, h heads, R table rows, N = B * T.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.autograd.function import FunctionCtx

__all__ = ["Attention", "GatherRows", "Linear", "Workspace"]


class Workspace:
    """Named buffers kept from step to step (made again when a shape or dtype changes).

    Example:
        >>> work = Workspace()
        >>> a = work.get("x", (2, 3), torch.zeros(1))
        >>> a is work.get("x", (2, 3), torch.zeros(1)), a is work.get("x", (3, 3), torch.zeros(1))
        (True, False)
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, shape: Sequence[int], like: Tensor) -> Tensor:
        """The buffer ``name`` of ``shape``, with ``like``'s dtype and device (contents: the
        last step's, or uninitialised)."""
        buffer = self._buffers.get(name)
        shape = tuple(shape)
        if (
            buffer is None
            or tuple(buffer.shape) != shape
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            buffer = torch.empty(shape, dtype=like.dtype, device=like.device)
            self._buffers[name] = buffer
        return buffer


class GatherRows(torch.autograd.Function):
    """``table[rows]`` into a workspace buffer: ``index_select`` forward, and its autograd
    backward (``index_add_`` into zeros: each table row's gradients summed in the order of
    ``rows``).

    ``apply(table, rows, work, name)``: ``[R, c]`` -> ``[len(rows), c]``.

    Example:
        >>> table = torch.arange(6.0).view(3, 2).requires_grad_()
        >>> GatherRows.apply(table, torch.tensor([2, 0, 2]), Workspace(), "t").tolist()
        [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]]
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        table: Float[Tensor, "R c"],
        rows: Int[Tensor, " n"],
        work: Workspace,
        name: str,
    ) -> Float[Tensor, "n c"]:
        ctx.save_for_backward(rows)
        ctx.shape = table.shape
        buffer = work.get(f"gather.{name}", (len(rows), table.shape[1]), table)
        return torch.index_select(table, 0, rows, out=buffer)

    @staticmethod
    def backward(ctx: Any, grad: Float[Tensor, "n c"]) -> tuple[Tensor | None, ...]:
        (rows,) = ctx.saved_tensors
        return grad.new_zeros(ctx.shape).index_add_(0, rows, grad), None, None, None


def _heads_view(x: Float[Tensor, "m N c"], T: int, h: int) -> Float[Tensor, "mB h T dh"]:
    """Token-major ``x`` seen head-major, ``[m * B, h, T, c / h]`` (strided)."""
    c = x.shape[-1]
    return x.view(-1, T, h, c // h).transpose(1, 2)


def _scaled_copy(source: Tensor, out: Tensor, scale: float, scaled: bool) -> None:
    """``out = source * scale`` where ``scaled`` (the one rounding of ``mul``, written straight
    into ``out``), else ``out = source``."""
    if scaled:
        torch.mul(source, scale, out=out)
    else:
        out.copy_(source)


class Attention(torch.autograd.Function):
    """The unpadded attention core of every head-count group, from the fused Q/K/V of every
    token ``[M, N, 3d]`` to the heads' merged output ``[M, N, d]``: per group, the ops of
    :func:`~mhainterp.fast.stacked_forward._attend` (causal: ``baddbmm`` of the ``-inf`` bias
    with the scale as ``alpha``; else ``bmm`` then the scale; softmax; ``bmm``) and the
    backward autograd derives from them, each big result in a workspace buffer and a
    gradient's scale and change of layout done in one pass (the same products: each value
    is still rounded once).

    ``apply(qkv, groups, T, causal_bias, work)``: ``groups`` as
    :meth:`~mhainterp.fast.stacked_params.StackedModels.head_groups` gives them,
    ``causal_bias`` ``[T, T]`` or None.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        qkv: Float[Tensor, "M N 3d"],
        groups: Sequence[tuple[int, int, int]],
        T: int,
        causal_bias: Float[Tensor, "T T"] | None,
        work: Workspace,
    ) -> Float[Tensor, "M N d"]:
        M, N, three_d = qkv.shape
        d = three_d // 3
        z = work.get("attn.z", (M, N, d), qkv)
        saved: list[Tensor] = []
        for g, (a, b, h) in enumerate(groups):
            dh, n = d // h, (b - a) * N // T * h
            part = qkv[a:b].view(-1, T, 3, h, dh)  # (m * B, T, 3, h, d_head)
            if h == 1:  # strided views, as _split_heads gives them
                q, k, v = part.view(-1, T, 3, dh).unbind(2)
            else:  # one copy to (3, m * B, h, T, d_head), as _split_heads makes it
                heads = work.get(f"attn.{g}.qkv", (3, n, T, dh), qkv)
                heads.view(3, -1, h, T, dh).copy_(part.permute(2, 0, 3, 1, 4))
                q, k, v = heads.unbind(0)
            scale = 1.0 / math.sqrt(dh)
            scores = work.get(f"attn.{g}.scores", (n, T, T), qkv)
            if causal_bias is not None:
                bias = causal_bias.expand(n, T, T)
                torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale, out=scores)
            else:
                torch.bmm(q, k.transpose(1, 2), out=scores).mul_(scale)
            pattern = work.get(f"attn.{g}.pattern", (n, T, T), qkv)
            torch.ops.aten._softmax.out(scores, -1, False, out=pattern)
            if h == 1:
                torch.bmm(pattern, v, out=z[a:b].view(n, T, dh))
            else:
                z_heads = torch.bmm(pattern, v, out=work.get(f"attn.{g}.z", (n, T, dh), qkv))
                _heads_view(z[a:b], T, h).copy_(z_heads.view(-1, h, T, dh))
            saved += [q, k, v, pattern]
        ctx.save_for_backward(*saved)
        ctx.groups, ctx.T, ctx.causal, ctx.work = list(groups), T, causal_bias is not None, work
        return z

    @staticmethod
    def backward(ctx: Any, grad_z: Float[Tensor, "M N d"]) -> tuple[Tensor | None, ...]:
        work, T = ctx.work, ctx.T
        saved = ctx.saved_tensors
        M, N, d = grad_z.shape
        grad_qkv = work.get("attn.grad_qkv", (M, N, 3 * d), grad_z)
        for g, (a, b, h) in enumerate(ctx.groups):
            q, k, v, pattern = saved[4 * g : 4 * g + 4]
            n, _, dh = q.shape
            scale = 1.0 / math.sqrt(dh)

            def buffer(name: str, *shape: int, g: int = g) -> Tensor:
                return work.get(f"attn.{g}.{name}", shape, grad_z)

            if h == 1:
                gz = grad_z[a:b].reshape(n, T, dh)
            else:  # the copy to head-major that autograd's reshape makes
                gz = buffer("grad_z", n, T, dh)
                gz.view(-1, h, T, dh).copy_(_heads_view(grad_z[a:b], T, h))
            # this group's Q, K, V gradients, seen (3, m * B, h, T, d_head) in the fused layout
            grad_parts = grad_qkv[a:b].view(-1, T, 3, h, dh).permute(2, 0, 3, 1, 4)
            # bmm's backward: grad @ mat2^T (the pattern's), self^T @ grad (v's)
            grad_pattern = torch.bmm(gz, v.transpose(1, 2), out=buffer("grad_pattern", n, T, T))
            grad_v = torch.bmm(pattern.transpose(1, 2), gz, out=buffer("grad_v", n, T, dh))
            grad_parts[2].copy_(grad_v.view(-1, h, T, dh))
            grad_scores = torch.ops.aten._softmax_backward_data.out(
                grad_pattern, pattern, -1, pattern.dtype, grad_input=buffer("grad_scores", n, T, T)
            )
            if not ctx.causal:  # the scale was a mul after the bmm: its backward comes first
                grad_scores.mul_(scale)
            # the scores' backward: grad @ k (q's), q^T @ grad (k^T's); a causal model's
            # baddbmm then multiplies both by its alpha, the scale
            grad_q = torch.bmm(grad_scores, k, out=buffer("grad_q", n, T, dh))
            _scaled_copy(grad_q.view(-1, h, T, dh), grad_parts[0], scale, ctx.causal)
            grad_kt = torch.bmm(q.transpose(1, 2), grad_scores, out=buffer("grad_kt", n, dh, T))
            grad_k = grad_kt.transpose(1, 2).view(-1, h, T, dh)
            _scaled_copy(grad_k, grad_parts[1], scale, ctx.causal)
        return grad_qkv, None, None, None, None


class Linear(torch.autograd.Function):
    """:func:`~mhainterp.fast.stacked_forward._linear` (``baddbmm`` of the bias, ``x`` and
    the weight transposed) plus, if given, the residual stream it writes into, into a
    workspace buffer; its backward is autograd's (``bmm`` for ``x`` and the weight, the bias's
    gradient summed by autograd as for any broadcast input), ``x``'s gradient into a buffer.

    ``apply(x, weight, bias, residual, work, name)``: ``x`` ``[M, N, i]``, ``weight``
    ``[M, o, i]``, ``bias`` ``[M, 1, o]``, ``residual`` ``[M, N, o]`` or None.
    The residual is added after the product, ``product + residual``: the bits of
    ``residual + product`` (a floating-point sum of two terms does not depend on their order).

    Example:
        >>> x, w, b = torch.ones(1, 2, 3), torch.ones(1, 4, 3), torch.zeros(1, 1, 4)
        >>> Linear.apply(x, w, b, None, Workspace(), "example").tolist()
        [[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]]
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: Float[Tensor, "M N i"],
        weight: Float[Tensor, "M o i"],
        bias: Float[Tensor, "M 1 o"],
        residual: Float[Tensor, "M N o"] | None,
        work: Workspace,
        name: str,
    ) -> Float[Tensor, "M N o"]:
        M, N, _ = x.shape
        out = work.get(f"linear.{name}", (M, N, weight.shape[1]), x)
        torch.baddbmm(bias, x, weight.transpose(1, 2), out=out)
        if residual is not None:
            out.add_(residual)
        ctx.save_for_backward(x, weight)
        ctx.work, ctx.name, ctx.residual = work, name, residual is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: Float[Tensor, "M N o"]) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = ctx.work.get(f"linear.{ctx.name}.grad_x", x.shape, grad)
        torch.bmm(grad, weight, out=grad_x)  # grad @ (weight^T)^T
        grad_weight = torch.bmm(x.transpose(1, 2), grad).transpose(1, 2)  # x^T @ grad, then
        # the transpose's backward
        return grad_x, grad_weight, grad, grad if ctx.residual else None, None, None
