"""Where and how the work runs: the device, torch's threads, evaluation mode, SIGTERM.

Light on purpose: importing this module imports neither torch nor pandas (the CLI's ``--help``
imports it), so each function imports torch when it is called.

- :func:`resolve_device` turns ``auto|cpu|cuda|cuda:N|mps`` (the ``--device`` option, the
  ``device=`` argument of ``build_model``, ``load_run`` and ``load_pretrained``) into a
  ``torch.device`` that exists on this machine, or raises one line saying what does.
- :func:`model_device` is THE device rule (DESIGN.md, "Devices"): a model's device is where its
  parameters are, and every function that takes a model follows it.
- :func:`torch_threads` runs a block with a chosen number of torch threads; ``ANALYSIS_THREADS``
  is what the analyses use unless told otherwise.
- :func:`eval_mode` puts a model in evaluation mode for a block.
- :func:`terminate_as_interrupt` makes SIGTERM end the work as Ctrl-C does.

Example:
    >>> str(resolve_device("cpu"))
    'cpu'
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mhainterp.validation import ParameterError

if TYPE_CHECKING:  # annotations only: the module stays importable without torch
    import torch

__all__ = [
    "ANALYSIS_THREADS",
    "DRAW_DEVICE",
    "DEVICE_CHOICES",
    "DEVICE_ENV",
    "eval_mode",
    "model_device",
    "resolve_device",
    "terminate_as_interrupt",
    "torch_threads",
]

DEVICE_CHOICES = "auto|cpu|cuda|cuda:N|mps"
"""What ``--device`` and every ``device=`` accept (``auto``: CUDA when available, else CPU)."""

DRAW_DEVICE = "cpu"  # the one place data is drawn: the same seed, the same batch on every device
"""Where every random draw of data happens (tasks' and resampling's CPU ``torch.Generator``);
a batch is then moved to the model's device once (``Batch.to``,
:func:`mhainterp.data.batch_for_model`)."""

DEVICE_ENV = "MHAINTERP_DEVICE"
"""Environment variable that ``auto`` reads first: set it to ``cpu`` to keep everything on the
CPU on a machine with a GPU (the test suite does, so its exact CPU tables stay exact)."""

ANALYSIS_THREADS = 1
"""torch threads the analyses use by default (``threads=None``), as ``train()`` does. Their
tensors are small: on a 2-core machine with other work running, torch's default of one thread
per core made ``division_of_labour`` 5-11x slower than one thread (threads contend for the
cores; see the README's Performance section). ``threads=0`` keeps torch's own setting."""

_DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def resolve_device(device: Any = "auto") -> torch.device:
    """The ``torch.device`` that ``device`` names, checked to exist on this machine.

    Args:
        device: ``"auto"`` or None (``$MHAINTERP_DEVICE`` if set, else CUDA when available,
            else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, or a
            ``torch.device``.

    Raises:
        ParameterError: a name that is none of these, or a device this machine does not have
            (one line that says which devices it has).

    Example:
        >>> resolve_device("cpu").type
        'cpu'
        >>> resolve_device("gpu")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: device='gpu' is invalid: one of auto|cpu|cuda|...
    """
    import torch

    if device is None:
        device = "auto"
    if isinstance(device, torch.device):
        name = str(device)
    elif isinstance(device, str):
        name = device.strip().lower()
    else:
        raise ParameterError(f"device={device!r} is invalid: one of {DEVICE_CHOICES}")
    if name == "auto":
        name = os.environ.get(DEVICE_ENV, "").strip().lower() or "auto"
        if name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")  # auto
    if not _DEVICE_PATTERN.match(name) or name == "auto":
        raise ParameterError(f"device={device!r} is invalid: one of {DEVICE_CHOICES}")
    resolved = torch.device(name)
    _require_present(resolved, device)
    return resolved


def _require_present(resolved: torch.device, asked: Any) -> None:
    """Refuse a device this machine does not have, naming the ones it has."""
    import torch

    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if resolved.index is None else resolved.index
        if index >= count:
            have = f"cuda:0..cuda:{count - 1}" if count else "no CUDA device"
            raise ParameterError(
                f"device={asked!r} is invalid: this machine has {have} (torch "
                f"{torch.__version__}); use --device cpu or auto"
            )
    elif resolved.type == "mps" and not (
        hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    ):
        raise ParameterError(
            f"device={asked!r} is invalid: this machine has no MPS device; use --device cpu or auto"
        )


def model_device(model: Any) -> torch.device:
    """Where ``model``'s parameters are: the device every function given the model runs on.

    Example:
        >>> import torch
        >>> model_device(torch.nn.Linear(2, 2)).type
        'cpu'
    """
    try:
        return next(model.parameters()).device
    except StopIteration:  # a model without parameters: its config says where it lives
        import torch

        device = getattr(getattr(model, "cfg", None), "device", None)
        return torch.device(device or "cpu")  # no parameters and no config: torch's default


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None or 0: unchanged), then restore it.

    Example:
        >>> import torch
        >>> with torch_threads(1):
        ...     torch.get_num_threads()
        1
    """
    import torch

    before = torch.get_num_threads()
    if threads and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def eval_mode(model: Any) -> Iterator[Any]:
    """Put ``model`` in evaluation mode inside the block; put it back in training mode after
    (also on an error) if it was in training mode before.

    It switches only when the model is training: ``Module.eval()`` walks every submodule, which
    is a measurable share of a small model's short evaluation (about 0.3 ms per switch on an
    8-head model, twice per call).

    Example:
        >>> import torch
        >>> layer = torch.nn.Dropout()
        >>> with eval_mode(layer):
        ...     layer.training
        False
        >>> layer.training
        True
    """
    if not model.training:
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        model.train(True)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM (what ``kill``, ``timeout``, ``docker stop`` and Slurm send) raises
    ``KeyboardInterrupt``: the work ends as on Ctrl-C (temp files removed, no half-written
    file, one line from the CLI, exit 130). Only in the main thread, and only where SIGTERM
    has its default action (a handler of the caller's is kept, and so is this one when the
    CLI installed it already).

    Example:
        >>> with terminate_as_interrupt():  # doctest: +SKIP
        ...     train(model, task, config, run_dir="runs/rev_h4")
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
