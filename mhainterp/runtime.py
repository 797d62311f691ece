"""Where and how the work runs: the device, torch's threads, evaluation mode, SIGTERM.

Light on purpose: importing this module imports neither torch nor pandas (the CLI's ``--help``
imports it), so each function imports torch when it is called.

- :func:`resolve_device` turns ``None|cpu|cuda|cuda:N|mps`` (the ``--device`` option, the
  ``device=`` argument of ``build_model``, ``load_run`` and ``load_pretrained``) into a
  ``torch.device`` that exists on this machine, or raises one line saying what does. None
  ("decide for me", also spelt ``"auto"``) is decided here and only here: the innermost
  :func:`device_context`, else ``$MHAINTERP_DEVICE``, else CUDA when available, else the CPU.
- :func:`model_device` is THE device rule (DESIGN.md, "Devices"): a model's device is where its
  parameters are, and every function that takes a model follows it.
- :func:`torch_threads` runs a block with a chosen number of torch threads;
  :func:`work_threads` is the rule ``train()`` and the analyses follow (``threads=None``:
  the innermost :func:`threads_context`, else ``$MHAINTERP_THREADS``, else
  :data:`DEFAULT_THREADS`).
- :func:`device_context` and :func:`threads_context` are how ``--device`` and ``--threads``
  reach every function a command calls (as scikit-learn's ``config_context``): they set what
  ``device=None`` and ``threads=None`` mean inside the block, in this thread's context, never
  in the environment. The environment is written only in a sweep's worker processes, which
  start with :func:`worker_environment` (:func:`enter_worker`).
- :func:`eval_mode` puts a model in evaluation mode for a block.
- :func:`terminate_as_interrupt` makes SIGTERM end the work as Ctrl-C does;
  :func:`leave_signals_to_parent` is how a worker process (a sweep's, the figure worker) leaves
  Ctrl-C and SIGTERM to the process that started it, and dies with it.

Example:
    >>> str(resolve_device("cpu"))
    'cpu'
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from mhainterp.validation import ParameterError

if TYPE_CHECKING:  # annotations only: the module stays importable without torch
    import torch

__all__ = [
    "DEFAULT_THREADS",
    "available_cpus",
    "DRAW_DEVICE",
    "DEVICE_CHOICES",
    "DEVICE_ENV",
    "THREADS_ENV",
    "WIDE_MODEL",
    "check_device_name",
    "device_context",
    "enter_worker",
    "eval_mode",
    "leave_signals_to_parent",
    "model_device",
    "reads_without_wait",
    "resolve_device",
    "terminate_as_interrupt",
    "threads_context",
    "torch_threads",
    "uses_work_threads",
    "work_threads",
    "worker_environment",
]

F = TypeVar("F", bound=Callable[..., Any])
ModelT = TypeVar("ModelT", bound="torch.nn.Module")

DEVICE_CHOICES = "auto|cpu|cuda|cuda:N|mps"
"""What ``--device`` and every ``device=`` accept (``auto``, or None: decide for me, see
:func:`resolve_device`). A ``torch.device("meta")`` is accepted too: shapes, no data."""

DRAW_DEVICE = "cpu"  # the one place data is drawn: the same seed, the same batch on every device
"""Where every random draw of data happens (tasks' and resampling's CPU ``torch.Generator``);
a batch is then moved to the model's device once (``Batch.to``,
:func:`mhainterp.data.batch_for_model`)."""

DEVICE_ENV = "MHAINTERP_DEVICE"
"""Environment variable that ``device=None`` reads outside any :func:`device_context`: set it
to ``cpu`` to keep everything on the CPU on a machine with a GPU (the test suite does, so its
exact CPU tables stay exact). A sweep's worker processes start with it set to the device their
runs were planned for (:func:`worker_environment`)."""

DEFAULT_THREADS = 1
"""torch threads that ``train()`` and the analyses use when not told (``threads=None``). Their
tensors are small, so handing their matmuls to more threads costs more than it saves: on a
2-core machine with other work running, torch's default of one thread per core made
``division_of_labour`` 5-11x slower than one thread and ``train()`` 5.8-20x slower (threads
contend for the cores; the README's Performance section). ``threads=0`` keeps torch's own."""

WIDE_MODEL = 256
"""A model this wide or wider (``cfg.d_model``: the pretrained ones, MiniLM 384 and SmolLM2
576; the toy models are 64 wide) runs with torch's own threads when not told: its matmuls are
large enough to share. On this 2-core machine a forward of 64 sentences took 4.1-4.4 s on two
threads against 7.9-8.2 s on one (SmolLM2), 0.44-0.50 s against 0.78-0.84 s (MiniLM), with
one other process running (:data:`DEFAULT_THREADS` is for the small models)."""

THREADS_ENV = "MHAINTERP_THREADS"
"""Environment variable that ``threads=None`` reads outside any :func:`threads_context`."""

_DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device_name(name: Any, what: str = "device") -> str:
    """``name`` if it is one of :data:`DEVICE_CHOICES` in form (whether this machine has it is
    :func:`resolve_device`'s question); what ``--device`` checks while parsing, without torch.

    Example:
        >>> check_device_name("cuda:1")
        'cuda:1'
    """
    if not isinstance(name, str) or not _DEVICE_PATTERN.match(name.strip().lower()):
        raise ParameterError(f"{what}={name!r} is invalid: one of {DEVICE_CHOICES}")
    return name.strip().lower()


_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mhainterp_device", default=None
)
"""What ``device=None`` means in this context (:func:`device_context`); None: not set here."""


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The ``torch.device`` that ``device`` names, checked to exist on this machine.

    None (or ``"auto"``, the same) is decided here, first match wins: the innermost
    :func:`device_context`, else ``$MHAINTERP_DEVICE``, else CUDA when available, else the CPU.

    Args:
        device: None or ``"auto"`` (decide, as above), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
            ``"mps"``, or a ``torch.device`` (``meta`` included: shapes, no data).

    Raises:
        ParameterError: a name that is none of these, or a device this machine does not have
            (one line that says which devices it has).

    Example:
        >>> resolve_device("cpu").type
        'cpu'
        >>> with device_context("cpu"):
        ...     resolve_device(None).type
        'cpu'
        >>> resolve_device("gpu")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: device='gpu' is invalid: one of auto|cpu|cuda|...
    """
    import torch

    source = ""  # where a decided name came from, for the error
    if _decides(device):
        device, source = _DEVICE.get(), " (from device_context)"
    if device is None:  # no context: the environment, else CUDA when available
        device, source = os.environ.get(DEVICE_ENV, ""), f" (from ${DEVICE_ENV})"
        if not device.strip() or _decides(device):
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")  # decided
    if isinstance(device, torch.device):
        name = str(device)
    elif isinstance(device, str):
        name = device.strip().lower()
    else:
        raise ParameterError(f"device={device!r} is invalid: one of {DEVICE_CHOICES}")
    if name == "meta":  # shapes only: present on every machine
        return torch.device("meta")
    if not _DEVICE_PATTERN.match(name):
        raise ParameterError(f"device={device!r}{source} is invalid: one of {DEVICE_CHOICES}")
    resolved = torch.device(name)
    _require_present(resolved, device)
    return resolved


def _decides(device: Any) -> bool:
    """Whether ``device`` asks to be decided (None, or the word ``auto``)."""
    return device is None or (isinstance(device, str) and device.strip().lower() == "auto")


@contextmanager
def device_context(device: str | torch.device | None) -> Iterator[None]:
    """Inside the block, ``device=None`` (and ``"auto"``) means ``device``: how a command's
    ``--device`` reaches every model it builds or loads and every analysis it runs, as
    scikit-learn's ``config_context`` does. It is a context variable, never the environment:
    this thread sees it, and so do the asyncio tasks it starts; a new thread starts with an
    empty context, so one that must see it runs in ``contextvars.copy_context()`` (the
    explorer's threads do). None or ``"auto"`` leave the outer choice as it is. The
    device is checked first, so one this machine lacks is one line before any work. Blocks
    nest; leaving one restores the outer choice.

    Example:
        >>> with device_context("cpu"):
        ...     with device_context(None):  # decide for me: the outer choice stays
        ...         str(resolve_device(None))
        'cpu'
    """
    if _decides(device):
        yield
        return
    resolve_device(device)  # a device this machine lacks: one line, now
    name = str(device) if not isinstance(device, str) else device.strip().lower()
    token = _DEVICE.set(name)
    try:
        yield
    finally:
        _DEVICE.reset(token)


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


def model_device(model: torch.nn.Module) -> torch.device:
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


def reads_without_wait(device: torch.device) -> bool:
    """Whether the host reads a tensor on ``device`` without waiting for a device: on the CPU
    a value read (``.item()``, ``bool()``, ``nonzero``) costs nothing; on a GPU each one stalls
    the host until the device has caught up (a host sync). Code that would branch on a value
    in a loop asks this, and on a device keeps the decision on the device instead.

    Example:
        >>> import torch
        >>> reads_without_wait(torch.device("cpu")), reads_without_wait(torch.device("meta"))
        (True, False)
    """
    return device.type == "cpu"  # the host's own memory


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
def work_threads(threads: int | None = None, model: Any = None) -> Iterator[None]:
    """Run the block with the threads ``train()`` and the analyses use: ``threads`` if given
    (0: torch's own setting), else the innermost :func:`threads_context`'s, else
    ``$MHAINTERP_THREADS``, else torch's own for a ``model`` at least :data:`WIDE_MODEL` wide
    and :data:`DEFAULT_THREADS` for any other.
    Inside another such block, ``threads=None`` keeps the outer choice (an analysis that calls
    another does not undo its caller's ``threads=``).

    Example:
        >>> import torch
        >>> with work_threads():
        ...     torch.get_num_threads()
        1
    """
    if threads is None:
        if _INSIDE_WORK.get():
            yield
            return
        threads = _THREADS.get()
        if threads is None:
            threads = _threads_from_environment(0 if _is_wide(model) else DEFAULT_THREADS)
    _check_threads(threads)
    token = _INSIDE_WORK.set(True)
    try:
        with torch_threads(threads):
            yield
    finally:
        _INSIDE_WORK.reset(token)


_INSIDE_WORK: contextvars.ContextVar[bool] = contextvars.ContextVar("inside_work", default=False)
_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "mhainterp_threads", default=None
)
"""What ``threads=None`` means in this context (:func:`threads_context`); None: not set here."""


def _check_threads(threads: Any) -> None:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise ParameterError(f"threads={threads!r} is invalid: an integer >= 0 (0: torch's own)")


def uses_work_threads(function: F) -> F:
    """Give an analysis the keyword ``threads=None`` and run it under :func:`work_threads`.

    One rule for every public analysis (``head_importance``, ``division_of_labour``,
    ``specialization_test``, ...), as ``train()`` has it: ``threads=None`` is the innermost
    :func:`threads_context`'s, else ``$MHAINTERP_THREADS``, else torch's own when the first
    argument is a model at least :data:`WIDE_MODEL` wide and :data:`DEFAULT_THREADS` otherwise;
    an integer that many, 0 torch's own.
    The signature shows the keyword (``help()``, ``inspect.signature``).

    Example:
        >>> import torch
        >>> @uses_work_threads
        ... def count():
        ...     return torch.get_num_threads()
        >>> count(), str(inspect.signature(count))
        (1, '(*, threads: int | None = None)')
    """

    @functools.wraps(function)
    def run(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        with work_threads(threads, model=args[0] if args else None):
            return function(*args, **kwargs)

    signature = inspect.signature(function)
    keyword = inspect.Parameter(
        "threads", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=int | None
    )
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    run.__signature__ = signature.replace(parameters=[*params[:at], keyword, *params[at:]])
    return run  # type: ignore[return-value]


def _is_wide(model: Any) -> bool:
    """Whether ``model`` (anything: the first argument of an analysis) is a model at least
    :data:`WIDE_MODEL` wide."""
    width = getattr(getattr(model, "cfg", None), "d_model", None)
    return isinstance(width, int) and width >= WIDE_MODEL


def _threads_from_environment(default: int = DEFAULT_THREADS) -> int:
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ParameterError(
            f"{THREADS_ENV}={text!r} is invalid: an integer >= 0 (0: torch's own)"
        ) from None


@contextmanager
def threads_context(threads: int | None) -> Iterator[None]:
    """Inside the block, ``threads=None`` means ``threads`` (what ``--threads`` sets for a
    command; None leaves the outer choice). A context variable, as :func:`device_context`.

    Example:
        >>> import torch
        >>> with threads_context(2), work_threads():
        ...     torch.get_num_threads()
        2
    """
    if threads is None:
        yield
        return
    _check_threads(threads)
    token = _THREADS.set(threads)
    try:
        yield
    finally:
        _THREADS.reset(token)


def worker_environment(device: str | torch.device) -> dict[str, str]:
    """The environment a sweep's worker process starts with (a process pool's or Ray's):
    ``device``, the one the runs were planned for (resolved when they were planned; as named,
    since a Ray driver may have no GPU of its own), and this context's ``threads`` when a
    :func:`threads_context` set them. A worker is a new process: this thread's context does
    not reach it (under spawn, or on another machine); its environment does.

    Example:
        >>> with threads_context(2):
        ...     worker_environment("cpu")
        {'MHAINTERP_DEVICE': 'cpu', 'MHAINTERP_THREADS': '2'}
    """
    environment = {DEVICE_ENV: str(device)}
    threads = _THREADS.get()
    if threads is not None:
        environment[THREADS_ENV] = str(threads)
    return environment


def enter_worker(environment: dict[str, str]) -> None:
    """In a sweep's worker process, as it starts: write ``environment``
    (:func:`worker_environment`) into this process's environment, the one place the toolkit
    writes it, and drop any device or threads context a fork copied from the parent, so
    the environment is the worker's one source."""
    os.environ.update(environment)
    _DEVICE.set(None)
    _THREADS.set(None)


@contextmanager
def eval_mode(model: ModelT) -> Iterator[ModelT]:
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


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity where the OS has one).

    Example:
        >>> len(available_cpus()) >= 1
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def leave_signals_to_parent(parent: int | None) -> None:
    """In a worker process: ignore Ctrl-C (the parent ends the work and says so in one line),
    take SIGTERM's default action (not a SIGTERM-as-Ctrl-C handler inherited by a fork), and
    die with the parent (:func:`_die_with_parent`), so a killed command leaves no orphan.
    ``parent``: the parent's pid, read before the worker started."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)


def _die_with_parent(parent: int | None) -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG);
    without it, the workers of a SIGKILLed sweep go on training as orphans and then wait
    forever for more work."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:  # the parent died before prctl
        os._exit(1)
