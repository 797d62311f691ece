"""How many runs a device holds at once: a sweep on a GPU trains its runs in as few stacked
groups as the device's free memory allows (:func:`mhainterp.sweep.executors.plan_device_groups`).

- :func:`plan_group_sizes`: the group sizes for ``n`` runs, a pure function of free memory and
  bytes per model (so the split is tested on any machine);
- :func:`device_memory`: free and total bytes (``torch.cuda.mem_get_info`` on CUDA);
- :func:`device_allocation_failures`: an out-of-memory error on the device is one line, as
  :func:`mhainterp.io.allocation_failures` makes it for the host's memory.

Example:
    >>> plan_group_sizes(1000, per_model=10 * 2**20, free=8 * 2**30)  # 737 fit: two groups
    [500, 500]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from mhainterp.errors import NotEnoughMemoryError
from mhainterp.io import available_memory, format_bytes
from mhainterp.runtime import resolve_device
from mhainterp.sweep.spec import RunSpec
from mhainterp.validation import ParameterError, check_float, check_int

__all__ = [
    "DEVICE_HEADROOM",
    "device_allocation_failures",
    "device_memory",
    "plan_group_sizes",
    "specs_device",
    "trains_in_groups",
]

DEVICE_HEADROOM = 0.9
"""Share of the device's free memory a plan fills: the rest is for the allocator's rounding
and fragmentation, and for whatever else the process allocates there meanwhile."""


def trains_in_groups(device: torch.device) -> bool:
    """Whether a sweep on ``device`` trains in-process stacked groups (a GPU: CUDA or MPS)
    rather than in a pool of CPU worker processes.

    Example:
        >>> trains_in_groups(torch.device("cuda")), trains_in_groups(torch.device("cpu"))
        (True, False)
    """
    return device.type in ("cuda", "mps")


def specs_device(specs: Sequence[RunSpec]) -> torch.device:
    """The device the runs were planned for (their ``model_config.device``, one for all),
    checked to exist here (:func:`mhainterp.runtime.resolve_device`).

    Example:
        >>> from mhainterp.config import SweepConfig
        >>> from mhainterp.sweep.spec import plan_sweep
        >>> specs_device(plan_sweep(SweepConfig(), "out", device="cpu")).type
        'cpu'
    """
    devices = sorted({str(spec.model_config.device) for spec in specs})
    if len(devices) != 1:
        raise ParameterError(
            f"specs is invalid: runs planned for one device, got {devices}; plan them with "
            "plan_sweep(config, out_dir, device=...)"
        )
    return resolve_device(devices[0])


def device_memory(device: torch.device) -> tuple[int, int]:
    """``(free, total)`` bytes on ``device``: ``torch.cuda.mem_get_info`` on CUDA; elsewhere
    (the CPU, or MPS, which shares the host's memory) what this process may still allocate,
    for both."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    free = available_memory()
    return free, free


def plan_group_sizes(
    n_runs: int,
    per_model: int,
    free: int,
    *,
    fixed: int = 0,
    headroom: float = DEVICE_HEADROOM,
    what: str = "training one model",
    where: str = "the device",
) -> list[int]:
    """Sizes of the fewest groups, of near-equal size, that ``n_runs`` runs split into when
    each run needs ``per_model`` bytes and a group ``fixed`` bytes more, within
    ``headroom * free`` bytes.

    Raises:
        NotEnoughMemoryError: not even one run fits (one line: both amounts, what to lower).

    Example:
        >>> plan_group_sizes(9, per_model=100, free=1000)  # 9 fit in 900
        [9]
        >>> plan_group_sizes(10, per_model=100, free=1000)  # two groups, not 9 + 1
        [5, 5]
        >>> plan_group_sizes(10, per_model=100, free=1000, fixed=200)  # 7 fit
        [5, 5]
    """
    check_int("n_runs", n_runs, minimum=1)
    check_int("per_model", per_model, minimum=1)
    check_float("headroom", headroom, minimum=0, maximum=1, inclusive=False)
    budget = max(0, int(free * headroom))
    fits = (budget - fixed) // per_model if budget > fixed else 0
    if fits < 1:
        raise NotEnoughMemoryError(
            f"{what} needs about {format_bytes(per_model + fixed)} of memory on {where}, but "
            f"{format_bytes(budget)} are free there; lower the sizes asked for"
        )
    n_groups = math.ceil(n_runs / fits)
    size, extra = divmod(n_runs, n_groups)
    return [size + 1] * extra + [size] * (n_groups - extra)


@contextmanager
def device_allocation_failures(what: str, device: torch.device) -> Iterator[None]:
    """Inside, an allocation on ``device`` that fails (``torch.cuda.OutOfMemoryError``, or
    torch's "out of memory" elsewhere) raises :class:`~mhainterp.errors.NotEnoughMemoryError`:
    one line naming ``what`` and the device.

    Example:
        >>> with device_allocation_failures("training", torch.device("meta")):
        ...     raise RuntimeError("out of memory")
        Traceback (most recent call last):
        mhainterp.errors.NotEnoughMemoryError: training ran out of memory on meta; lower the ...
    """
    try:
        yield
    except NotEnoughMemoryError:
        raise
    except RuntimeError as error:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if not _is_out_of_memory(error):
            raise
        raise NotEnoughMemoryError(_out_of_memory_line(error, what, device)) from None


def _is_out_of_memory(error: BaseException) -> bool:
    cuda_oom = getattr(torch.cuda, "OutOfMemoryError", ())  # torch >= 2.0
    return isinstance(error, cuda_oom) or "out of memory" in str(error)


def _out_of_memory_line(error: BaseException, what: str, device: torch.device) -> str:
    """``error``'s one line: what ran out, how much it asked for at once, the device's size.

    Example:
        >>> error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; ...)")
        >>> _out_of_memory_line(error, "training 900 runs", torch.device("meta"))
        'training 900 runs ran out of memory on meta (2.00 GiB at once); lower the sizes asked for'
    """
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(error))
    size = f" ({asked.group(1)} at once)" if asked else ""
    where = str(device)
    if device.type == "cuda":
        where += f" ({format_bytes(device_memory(device)[1])} in all)"
    return f"{what} ran out of memory on {where}{size}; lower the sizes asked for"
