"""``Task``: the abstract base every synthetic task (built-in or user-defined) derives from.

A subclass sets ``name``, ``causal`` (and ``min_layers`` if more than one layer is needed),
defines ``d_vocab_out``, and implements two pure functions of the tokens:
``compute_targets(tokens, padding_mask) -> (targets, mask)`` and
``compute_relations(tokens, padding_mask) -> dict``. Sampling, padding, validation, the fixed
evaluation set and the model keyword arguments come from the base class.

Shapes: n sequences, pos positions (``seq_len``), q/k query/key positions.
"""

from __future__ import annotations

import abc
import hashlib
import inspect
import json
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.io import require_memory
from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.runtime import DRAW_DEVICE
from mhainterp.tasks.batch import Batch
from mhainterp.tasks.contract import MAX_SEQ_LEN, MAX_VOCAB, check_labels, task_error
from mhainterp.tasks.templates import check_tokens
from mhainterp.validation import ParameterError, check_int, invalid

__all__ = ["Task", "init_param_names"]

_EVAL_SALT = "mhainterp/eval-set/v1"
_EVAL_SEED_OFFSET = 2**32  # eval seeds lie in [2**32, 2**63): never equal to a user's 32-bit seed
_CHECKED_BATCH_BYTES = 64 * 2**20  # batches larger than this are checked against free memory


def init_param_names(cls: type) -> list[str] | None:
    """Keyword parameters a class's constructor accepts, following ``**kwargs`` up the MRO.

    Returns None when the accepted names cannot be known (a ``**kwargs`` that reaches a
    constructor without a signature).

    Example:
        >>> from mhainterp.tasks import ReverseTask
        >>> init_param_names(ReverseTask)
        ['seq_len', 'd_vocab', 'min_len']
    """
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return names
        try:
            params = list(inspect.signature(init).parameters.values())[1:]  # drop self
        except (TypeError, ValueError):
            return None
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names:
                names.append(p.name)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return names
    return names


class Task(abc.ABC):
    """A synthetic sequence task with known ground-truth attention relations.

    Subclasses set the class attributes ``name``, ``causal``, ``min_layers`` (default 1) and
    ``n_special_tokens`` (default 0), define the ``d_vocab_out`` property, and implement
    ``compute_targets`` and ``compute_relations``. Constructor parameters must be stored as
    attributes of the same name (as in scikit-learn) so ``params`` can rebuild the task; extra
    ones are added to the signature after ``seq_len, d_vocab, min_len``.

    Args:
        seq_len: Sequence length (the model's ``n_ctx``), ``>= 2``.
        d_vocab: Number of real token values ``0 .. d_vocab - 1``, ``>= 2``.
        min_len: Shortest sequence, ``1 <= min_len <= seq_len``; defaults to ``seq_len``
            (fixed length). When ``min_len < seq_len`` each sequence's length is drawn
            uniformly from ``[min_len, seq_len]`` and the rest is padded at the end with
            ``pad_token = d_vocab``.

    Attributes:
        pad_token: ``d_vocab`` when sequences can be padded, else None.
        d_vocab_in: The model's input vocabulary: ``d_vocab`` (+1 if padded, + special tokens).
        d_vocab_out: Output classes, shared by all targets.
        n_targets: Targets per position (targets are ``[n, pos, n_targets]`` when > 1).
        target_names: One name per target.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("reverse", seq_len=4, d_vocab=10)
        >>> task.targets_for(torch.tensor([[1, 2, 3, 4]]))[0].tolist()
        [[4, 3, 2, 1]]
    """

    name: str = ""
    causal: bool = False
    min_layers: int = 1
    n_special_tokens: int = 0

    def __init__(self, seq_len: int = 16, d_vocab: int = 10, min_len: int | None = None) -> None:
        self.seq_len = check_int("seq_len", seq_len, minimum=2, maximum=MAX_SEQ_LEN)
        self.d_vocab = check_int("d_vocab", d_vocab, minimum=2, maximum=MAX_VOCAB)
        self.min_len = self.seq_len if min_len is None else check_int("min_len", min_len, minimum=1)
        if self.min_len > self.seq_len:
            raise invalid(
                "min_len",
                min_len,
                f"an integer >= 1 and <= seq_len={self.seq_len} (min_len=seq_len, the default, "
                "means fixed-length sequences)",
            )
        if not self.name:
            self.name = type(self).__name__

    # ------------------------------------------------------------------ description

    @property
    def params(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this task: ``get_task(task.name, **task.params)``."""
        names = init_param_names(type(self))
        if names is None:
            raise TypeError(
                f"cannot find the constructor parameters of {type(self).__name__}: its __init__ "
                f"takes **kwargs that reach a constructor without a signature; list them "
                f"explicitly."
            )
        missing = [n for n in names if not hasattr(self, n)]
        if missing:
            raise TypeError(
                f"{type(self).__name__}.__init__ parameters {missing} are not stored as "
                f"attributes of the same name (self.{missing[0]} = {missing[0]}); store them so "
                f"the task can be rebuilt from its params."
            )
        return {n: getattr(self, n) for n in names}

    @property
    def variable_length(self) -> bool:
        """True when sequences have random lengths in ``[min_len, seq_len]`` (and padding)."""
        return self.min_len < self.seq_len

    @property
    def pad_token(self) -> int | None:
        """The padding token id (``d_vocab``) when sequences can be padded, else None."""
        return self.d_vocab if self.variable_length else None

    @property
    def special_tokens(self) -> list[int]:
        """Ids of the task's special tokens: after the real tokens and the pad token."""
        start = self.d_vocab + (self.pad_token is not None)
        return list(range(start, start + self.n_special_tokens))

    @property
    def d_vocab_in(self) -> int:
        """The model's input vocabulary: real tokens, the pad token if any, special tokens."""
        return self.d_vocab + (self.pad_token is not None) + self.n_special_tokens

    @property
    @abc.abstractmethod
    def d_vocab_out(self) -> int:
        """Number of output classes, shared by all targets."""

    @property
    def n_targets(self) -> int:
        """Targets per position."""
        return 1

    @property
    def target_names(self) -> list[str]:
        """One name per target; the task name when there is one target."""
        return [self.name]

    @property
    def relation_names(self) -> list[str]:
        """The keys of ``relations(...)``."""
        batch = self.sample(1, torch.Generator().manual_seed(0))
        return list(self.relations(batch.tokens, batch.padding_mask))

    @property
    def eval_seed(self) -> int:
        """Seed of the fixed evaluation set: a stable hash of (name, params), in
        ``[2**32, 2**63)`` so it never equals a training seed below ``2**32``."""
        key = json.dumps([_EVAL_SALT, self.name, self.params], sort_keys=True)
        digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
        return _EVAL_SEED_OFFSET + digest % (2**63 - _EVAL_SEED_OFFSET)

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a model config that fits this task.

        Example:
            >>> from mhainterp.tasks import get_task
            >>> get_task("previous_token", seq_len=8, d_vocab=5).model_kwargs()["d_vocab_out"]
            6
        """
        return dict(
            n_ctx=self.seq_len,
            d_vocab=self.d_vocab_in,
            d_vocab_out=self.d_vocab_out,
            n_targets=self.n_targets,
            causal=self.causal,
            n_layers=self.min_layers,
        )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}(name={self.name!r}, {args})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Task):
            return NotImplemented
        return (type(self), self.name, self.params) == (type(other), other.name, other.params)

    def __hash__(self) -> int:
        return hash((type(self), self.name, json.dumps(self.params, sort_keys=True)))

    # ------------------------------------------------------------------ to implement

    @abc.abstractmethod
    def compute_targets(
        self, tokens: Int[Tensor, "n pos"], padding_mask: Bool[Tensor, "n pos"]
    ) -> tuple[Int[Tensor, "n pos *k"], Bool[Tensor, "n pos"]]:
        """Targets and scored-position mask for validated tokens (override; call
        ``targets_for`` instead). Values at unscored positions are ignored and padding positions
        are removed from the mask afterwards."""

    @abc.abstractmethod
    def compute_relations(
        self, tokens: Int[Tensor, "n pos"], padding_mask: Bool[Tensor, "n pos"]
    ) -> dict[str, Float[Tensor, "n q k"]]:
        """Relation templates for validated tokens (override; call ``relations`` instead)."""

    def sample_lengths(self, n: int, generator: torch.Generator | None) -> Int[Tensor, " n"]:
        """Real length of each sequence: uniform on ``[min_len, seq_len]`` (no draw if fixed)."""
        if not self.variable_length:
            return torch.full((n,), self.seq_len, dtype=torch.int64, device=DRAW_DEVICE)
        return torch.randint(
            self.min_len, self.seq_len + 1, (n,), generator=generator, device=DRAW_DEVICE
        )

    def sample_tokens(
        self, n: int, lengths: Int[Tensor, " n"], generator: torch.Generator | None
    ) -> Int[Tensor, "n pos"]:
        """Tokens at every position (padding is written over them afterwards): uniform on
        ``[0, d_vocab)`` unless a subclass says otherwise."""
        shape = (n, self.seq_len)
        return torch.randint(0, self.d_vocab, shape, generator=generator, device=DRAW_DEVICE)

    # ------------------------------------------------------------------ public API

    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """Draw ``n`` sequences with their targets.

        Args:
            n: Number of sequences (``>= 1``).
            generator: CPU ``torch.Generator`` all randomness comes from; the same seed gives
                the same batch. None uses torch's global generator.

        Returns:
            A :class:`Batch` on the CPU.

        Example:
            >>> from mhainterp.tasks import get_task
            >>> task = get_task("sort", seq_len=6)
            >>> b = task.sample(4, torch.Generator().manual_seed(0))
            >>> b.tokens.shape, b.targets.shape
            (torch.Size([4, 6]), torch.Size([4, 6]))
        """
        n = check_int("n", n, minimum=1)
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise TypeError(
                    f"generator must be a torch.Generator or None, got {type(generator).__name__}."
                )
            if generator.device != torch.device(DRAW_DEVICE):
                raise ParameterError(
                    f"generator is invalid: a CPU torch.Generator (batches are drawn on the CPU "
                    f"and moved with Batch.to), got one on {generator.device}."
                )
        self._require_memory(n)
        lengths = self.sample_lengths(n, generator)  # (n,)
        tokens = self.sample_tokens(n, lengths, generator).long()  # (n, pos)
        positions = torch.arange(self.seq_len, device=lengths.device)
        padding_mask = positions[None, :] < lengths[:, None]  # (n, pos)
        if self.pad_token is not None:
            tokens = tokens.masked_fill(~padding_mask, self.pad_token)
        targets, mask = self.label_tokens(tokens, padding_mask)
        return Batch(tokens=tokens, targets=targets, mask=mask, padding_mask=padding_mask)

    def _require_memory(self, n: int) -> None:
        """Refuse ``n`` sequences that cannot fit, before allocating them (one line saying how
        much: ``--n-eval 1000000000`` asked of any command). The batch holds int64 tokens and
        targets and two bool masks, twice over while it is labelled; small batches (every
        training step's) skip the check, which reads /proc."""
        needed = 2 * n * self.seq_len * (8 + 8 * self.n_targets + 2)
        if needed > _CHECKED_BATCH_BYTES:
            what = f"sampling {n:,} sequences of {self.name!r} (n_eval or batch_size)"
            require_memory(needed, what)

    def eval_batch(self, n: int = DEFAULT_N_EVAL) -> Batch:
        """The fixed evaluation set: ``sample(n)`` from a generator seeded with ``eval_seed``.

        The same (name, params) gives the same sequences in every process and every run. It is
        built once per task and size and then shared (an analysis asks for it from many
        functions), so treat its tensors as read-only.

        Example:
            >>> from mhainterp.tasks import get_task
            >>> a, b = get_task("reverse").eval_batch(16), get_task("reverse").eval_batch(16)
            >>> bool((a.tokens == b.tokens).all())
            True
        """
        cache = self.__dict__.setdefault("_eval_batches", {})
        if n not in cache:
            if len(cache) >= 4:  # a few sizes at most (the analysis's, a null's, a preview)
                cache.pop(next(iter(cache)))
            cache[n] = self.sample(n, torch.Generator().manual_seed(self.eval_seed))
        return cache[n]

    def targets_for(
        self, tokens: Tensor, padding_mask: Tensor | None = None
    ) -> tuple[Int[Tensor, "n pos *k"], Bool[Tensor, "n pos"]]:
        """Targets and scored-position mask for given tokens (what ``sample`` labels with).

        Args:
            tokens: ``[n, seq_len]`` token ids; real tokens in ``[0, d_vocab)``.
            padding_mask: ``[n, seq_len]`` bool, True for real tokens. When None it is
                ``tokens != pad_token`` for a padded task and all True otherwise.

        Returns:
            ``(targets, mask)``: int64 ``[n, pos]`` (``[n, pos, n_targets]`` for several
            targets) with ``-100`` wherever ``mask`` is False, and the bool ``[n, pos]`` mask.

        Example:
            >>> from mhainterp.tasks import get_task
            >>> targets, mask = get_task("count_previous", seq_len=5, d_vocab=4).targets_for(
            ...     torch.tensor([[3, 1, 3, 3, 1]]))
            >>> targets.tolist()
            [[0, 0, 1, 2, 1]]
        """
        tokens, padding_mask = self._check_input(tokens, padding_mask)
        return self.label_tokens(tokens, padding_mask)

    def relations(
        self, tokens: Tensor, padding_mask: Tensor | None = None
    ) -> dict[str, Float[Tensor, "n q k"]]:
        """The 0/1 attention templates of the relations the task depends on.

        Args:
            tokens: ``[n, seq_len]`` token ids.
            padding_mask: As in :meth:`targets_for`.

        Returns:
            Relation name -> float32 ``[n, q, k]`` template marking, for query ``q``, the
            keys where the answer lives. Rows and columns of padding positions are 0.

        Example:
            >>> from mhainterp.tasks import get_task
            >>> rel = get_task("reverse", seq_len=3).relations(torch.tensor([[4, 5, 6]]))
            >>> rel["mirror"][0].tolist()
            [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
        """
        tokens, padding_mask = self._check_input(tokens, padding_mask)
        out = self.compute_relations(tokens, padding_mask)
        both_real = (padding_mask[:, :, None] & padding_mask[:, None, :]).float()
        n, pos = tokens.shape
        result = {}
        if not isinstance(out, dict):
            what = f"it must return a dict of relation name -> tensor, got {type(out).__name__}"
            raise task_error(self.name, "compute_relations", what)
        for name, template in out.items():
            if not isinstance(template, Tensor) or tuple(template.shape) != (n, pos, pos):
                shape = tuple(template.shape) if isinstance(template, Tensor) else type(template)
                what = (
                    f"relation {name!r} must be a [n, q, k] = {(n, pos, pos)} tensor, got {shape}"
                )
                raise task_error(self.name, "compute_relations", what)
            result[name] = template.float() * both_real
        return result

    # ------------------------------------------------------------------ internals

    def _check_input(
        self, tokens: Tensor, padding_mask: Tensor | None
    ) -> tuple[Int[Tensor, "n pos"], Bool[Tensor, "n pos"]]:
        if padding_mask is None and self.pad_token is not None and isinstance(tokens, Tensor):
            padding_mask = tokens != self.pad_token
        tokens, padding_mask = check_tokens(tokens, padding_mask)
        if tokens.shape[1] != self.seq_len:
            raise ParameterError(
                f"tokens is invalid: {self.seq_len} positions ({self!r} has seq_len="
                f"{self.seq_len}), got {tokens.shape[1]}; pad shorter sequences at the end and "
                "pass a padding_mask."
            )
        real = tokens[padding_mask]
        bad = (real < 0) | (real >= self.d_vocab_in)
        if self.pad_token is not None:
            bad |= real == self.pad_token
        if bad.any():
            raise ParameterError(
                f"tokens is invalid: real (non-padding) ids in [0, {self.d_vocab}) (or special "
                f"tokens {self.special_tokens}); got {real[bad][:5].tolist()}. Mark padding "
                f"positions False in padding_mask."
            )
        return tokens, padding_mask

    def label_tokens(
        self, tokens: Int[Tensor, "n pos"], padding_mask: Bool[Tensor, "n pos"]
    ) -> tuple[Int[Tensor, "n pos *k"], Bool[Tensor, "n pos"]]:
        """:meth:`targets_for` of tokens already checked: ``compute_targets`` checked, the mask
        joined with ``padding_mask`` and unscored targets set to ``IGNORE_INDEX``.

        The batched trainer (:mod:`mhainterp.fast.stacked`) labels later batches the same way
        without the reads back to the host, unless a task overrides this method.
        """
        labels = self.compute_targets(tokens, padding_mask)
        if not isinstance(labels, (tuple, list)) or len(labels) != 2:
            what = f"it must return a (targets, mask) pair, got {type(labels).__name__}"
            raise task_error(self.name, "compute_targets", what)
        targets, mask = labels
        n, pos = tokens.shape
        expected = (n, pos) if self.n_targets == 1 else (n, pos, self.n_targets)
        check_labels(self, targets, mask, expected)
        mask = mask.bool() & padding_mask
        full_mask = mask if self.n_targets == 1 else mask[:, :, None].expand_as(targets)
        targets = targets.long().masked_fill(~full_mask, IGNORE_INDEX)
        scored = targets[full_mask]
        if ((scored < 0) | (scored >= self.d_vocab_out)).any():
            what = (
                f"targets must lie in [0, d_vocab_out={self.d_vocab_out}) where scored; got "
                f"{scored.unique()[:10].tolist()}"
            )
            raise task_error(self.name, "compute_targets", what)
        return targets, mask
