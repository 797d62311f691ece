"""Ending a forward pass early, once a hook has what its caller needs.

Capturing the clean ``hook_z`` of layer 0, or the last activation an analysis reads, needs
only the layers up to it: the rest of the forward would be computed for nothing.
"""

from __future__ import annotations

from types import TracebackType

__all__ = ["StopForward"]


class StopForward(Exception):  # noqa: N818 - a signal, as StopIteration is, not an error
    """Ends a forward pass from inside a hook: make one per forward, ``raise`` it in the hook,
    and run the forward inside ``with`` it. The forward ends at the hook; what the hooks
    stored up to there is all there is (the forward returns nothing).

    The ``with`` catches only its own instance: a forward that stops early inside another's
    hooks (a pretrained bridge's own forward, run by a capture hook's caller) lets the outer
    one's stop pass through to the outer ``with``. Works on any ``HookedRootModule``.

    Example:
        >>> import torch
        >>> from mhainterp.config import ModelConfig
        >>> from mhainterp.model import HookedMHATransformer
        >>> model = HookedMHATransformer(ModelConfig(
        ...     d_model=16, n_heads=2, n_layers=2, n_ctx=4, d_vocab=5, device="cpu"))
        >>> seen, stop = {}, StopForward()
        >>> def keep(z, hook):
        ...     seen[hook.name] = z
        ...     raise stop  # layer 1 and the unembedding are not computed
        >>> with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", keep)]), stop:
        ...     model(torch.zeros(1, 4, dtype=torch.long))
        >>> seen["blocks.0.attn.hook_z"].shape
        torch.Size([1, 4, 2, 8])
    """

    def __enter__(self) -> StopForward:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        if error is not self:
            return False  # no stop, or another forward's: it goes on to its own ``with``
        self.__traceback__ = None  # its frames hold activations; the instance may be reused
        return True
