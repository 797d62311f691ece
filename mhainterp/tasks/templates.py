"""Relation templates: 0/1 attention patterns marking, for each query, the keys of a relation.

Every builder has the signature ``f(tokens, padding_mask=None, ...) -> Float[Tensor, "n q k"]``:
``tokens`` is ``[n, pos]`` (any integer dtype), ``padding_mask`` is ``[n, pos]`` bool with True for
real tokens (padding only at the END of a sequence; ``None`` means no padding). The result is
float32 ``[n, q, k]`` with ``q = k = pos``; rows and columns of padding positions are all 0, and a
query the relation does not apply to (e.g. position 0 for ``previous``) has an all-zero row.

``L`` below is a sequence's real length, ``padding_mask.sum(-1)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.validation import ParameterError, invalid

__all__ = [
    "RELATION_TEMPLATES",
    "check_tokens",
    "finish_template",
    "first_position_template",
    "induction_template",
    "mirror_template",
    "previous_token_template",
    "query_key_positions",
    "same_token_template",
    "self_template",
    "sort_source_template",
    "uniform_template",
]

_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def check_tokens(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> tuple[Int[Tensor, "n pos"], Bool[Tensor, "n pos"]]:
    """Validate ``tokens`` / ``padding_mask`` and return them as (int64, bool) tensors.

    Args:
        tokens: ``[n, pos]`` integer tensor.
        padding_mask: ``[n, pos]`` bool tensor (True = real token, padding at the end only), or
            None for no padding.

    Returns:
        ``(tokens, padding_mask)`` with ``tokens`` as int64 and a full bool mask.

    Raises:
        TypeError: If an argument is not a tensor of the right dtype.
        ValueError: If shapes disagree or padding is not at the end of every sequence.

    Example:
        >>> tokens, pm = check_tokens(torch.tensor([[1, 2, 3]]))
        >>> pm.tolist()
        [[True, True, True]]
    """
    if not isinstance(tokens, Tensor):
        raise TypeError(
            f"tokens must be a torch.Tensor of shape [n, pos], got {type(tokens).__name__}; "
            f"wrap a list with torch.tensor(...)."
        )
    if tokens.dtype not in _INT_DTYPES:
        raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}.")
    if tokens.ndim != 2:
        raise ParameterError(
            f"tokens is invalid: shape [n, pos], got shape {tuple(tokens.shape)}; "
            f"for one sequence use tokens[None]."
        )
    tokens = tokens.long()
    if padding_mask is None:
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
        got = padding_mask.dtype if isinstance(padding_mask, Tensor) else type(padding_mask)
        raise TypeError(f"padding_mask must be a bool tensor, got {got}.")
    if padding_mask.shape != tokens.shape:
        raise ParameterError(
            f"padding_mask is invalid: the shape of tokens {tuple(tokens.shape)}, "
            f"got {tuple(padding_mask.shape)}."
        )
    if (padding_mask[:, 1:] & ~padding_mask[:, :-1]).any():
        raise ParameterError(
            "padding_mask is invalid: True on a prefix of each row (padding at the END of a "
            "sequence only), got a real token after a padding position."
        )
    return tokens, padding_mask.to(tokens.device)


def query_key_positions(tokens: Tensor) -> tuple[Int[Tensor, "q 1"], Int[Tensor, "1 k"]]:
    """Query positions as a column and key positions as a row, to compare into ``[q, k]``.

    Example:
        >>> q, k = query_key_positions(torch.zeros(1, 3))
        >>> (k == q - 1).int().tolist()
        [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    """
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    return pos[:, None], pos[None, :]


def finish_template(
    rel: Bool[Tensor, "n q k"], padding_mask: Bool[Tensor, "n pos"]
) -> Float[Tensor, "n q k"]:
    """A relation template from its boolean ``[n, q, k]`` relation: rows and columns of padding
    positions zeroed, as float32 (the last step of every template here and in tasks.text)."""
    both_real = padding_mask[:, :, None] & padding_mask[:, None, :]
    return (rel & both_real).float()


def previous_token_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """The previous position: ``1`` at ``k = q - 1`` (row 0 is empty).

    Example:
        >>> previous_token_template(torch.tensor([[7, 8, 9]]))[0].tolist()
        [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    return finish_template((k == q - 1).expand(tokens.shape[0], -1, -1), padding_mask)


def mirror_template(tokens: Tensor, padding_mask: Tensor | None = None) -> Float[Tensor, "n q k"]:
    """The mirrored position of the real sequence: ``1`` at ``k = L - 1 - q``.

    Example:
        >>> mirror_template(torch.tensor([[7, 8, 9]]))[0].tolist()
        [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    lengths = padding_mask.sum(-1)  # (n,)
    source = lengths[:, None] - 1 - q[:, 0][None, :]  # (n, q): k = L - 1 - q
    return finish_template(k[None] == source[:, :, None], padding_mask)


def same_token_template(
    tokens: Tensor,
    padding_mask: Tensor | None = None,
    *,
    strictly_before: bool = False,
    up_to_self: bool = False,
) -> Float[Tensor, "n q k"]:
    """Positions holding the same token as the query.

    Args:
        tokens: ``[n, pos]`` token ids.
        padding_mask: ``[n, pos]`` bool, True for real tokens; None = no padding.
        strictly_before: Only earlier positions (``k < q``).
        up_to_self: Earlier positions and the query's own (``k <= q``): the set a causal
            counting head spreads over (its own position makes every row non-empty, so
            the share on each copy, ``1 / (count + 1)``, encodes the count).
            Without either flag: every position, ``q`` itself included.

    Example:
        >>> same_token_template(torch.tensor([[3, 1, 3]]), strictly_before=True)[0].tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
        >>> same_token_template(torch.tensor([[3, 1, 3]]), up_to_self=True)[0].tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    """
    if strictly_before and up_to_self:
        raise invalid("up_to_self", up_to_self, "False when strictly_before=True (pick one)")
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    rel = tokens[:, :, None] == tokens[:, None, :]  # (n, q, k)
    if strictly_before or up_to_self:
        q, k = query_key_positions(tokens)
        rel = rel & ((k < q) if strictly_before else (k <= q))
    return finish_template(rel, padding_mask)


def self_template(tokens: Tensor, padding_mask: Tensor | None = None) -> Float[Tensor, "n q k"]:
    """The query's own position: ``1`` at ``k = q``.

    Example:
        >>> self_template(torch.tensor([[7, 8]]))[0].tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    return finish_template((k == q).expand(tokens.shape[0], -1, -1), padding_mask)


def first_position_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """The first position (a common "resting" / no-op pattern): ``1`` at ``k = 0``.

    Example:
        >>> first_position_template(torch.tensor([[7, 8]]))[0].tolist()
        [[1.0, 0.0], [1.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    _, k = query_key_positions(tokens)
    return finish_template((k == 0).expand(tokens.shape[0], tokens.shape[1], -1), padding_mask)


def uniform_template(
    tokens: Tensor, padding_mask: Tensor | None = None, *, causal: bool = False
) -> Float[Tensor, "n q k"]:
    """Every key the query may see: all real keys, or only ``k <= q`` when ``causal``.

    Not normalised: divide by the row sum for the uniform attention distribution.

    Example:
        >>> uniform_template(torch.tensor([[7, 8]]), causal=True)[0].tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    visible = (k <= q) if causal else torch.ones_like(k == q)
    return finish_template(visible.expand(tokens.shape[0], -1, -1), padding_mask)


def sort_source_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """Where the ``q``-th smallest real token sits (ties broken by position, a stable sort).

    Example:
        >>> sort_source_template(torch.tensor([[3, 1, 1]]))[0].tolist()
        [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    _, k = query_key_positions(tokens)
    keys = tokens.masked_fill(~padding_mask, torch.iinfo(torch.int64).max)  # padding sorts last
    source = torch.sort(keys, dim=-1, stable=True).indices  # (n, q): position of q-th smallest
    return finish_template(k[None] == source[:, :, None], padding_mask)


def induction_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """The token after each earlier copy of the query's token: ``k = j + 1`` for every
    ``j < q`` with ``tokens[j] == tokens[q]``.

    This is the induction-head pattern ("[A][B] ... [A] -> attend to [B]").

    Example:
        >>> induction_template(torch.tensor([[5, 6, 5, 6]]))[0].tolist()
        [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    before = torch.roll(tokens, 1, dims=-1)  # before[:, k] = tokens[:, k - 1] (wraps at k = 0)
    rel = tokens[:, :, None] == before[:, None, :]  # (n, q, k): tokens[q] == tokens[k - 1]
    return finish_template(rel & (k >= 1) & (k <= q), padding_mask)


RELATION_TEMPLATES: dict[str, Callable[..., Tensor]] = {
    "previous": previous_token_template,
    "mirror": mirror_template,
    "same_token": same_token_template,
    "same_token_before": lambda tokens, padding_mask=None: same_token_template(
        tokens, padding_mask, strictly_before=True
    ),
    "same_token_upto": lambda tokens, padding_mask=None: same_token_template(
        tokens, padding_mask, up_to_self=True
    ),
    "self": self_template,
    "first_position": first_position_template,
    "uniform": uniform_template,
    "uniform_causal": lambda tokens, padding_mask=None: uniform_template(
        tokens, padding_mask, causal=True
    ),
    "sort_source": sort_source_template,
    "induction": induction_template,
}
"""Relation name -> template builder ``f(tokens, padding_mask=None)``; the names tasks use as the
keys of ``Task.relations``, plus generic baselines (``self``, ``first_position``, ``uniform``)."""
