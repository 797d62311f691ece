"""A strict simulated device: CUDA's placement rules, enforced on the CPU, without a GPU.

CI has no GPU, and the CPU forgives what CUDA refuses: a result moved to the CPU and mixed back
with the model's tensors, a ``.numpy()`` of a device tensor, a CPU generator asked to fill a
device tensor. And the CPU hides what a GPU pays for: every ``.item()`` makes the host wait for
the device (a *host sync*). This module makes both visible.

Tensors "on the device" are :class:`DeviceTensor`: a wrapper subclass that reports the device
``lazy:0`` and keeps its values in an ordinary CPU tensor (``.host``). ``lazy`` is a device type
whose guard exists in CPU builds of torch, so autograd, ``nn.Module.to`` and optimizers accept
it. Inside :func:`strict_device`, a ``TorchDispatchMode`` sees every aten op, checks it against
CUDA's rules, runs it on the host values and wraps the result again:

- a CPU tensor with ``dim > 0`` meeting a device tensor raises :class:`DeviceMixError` (a 0-dim
  CPU tensor is a scalar, which CUDA accepts; copies between devices are allowed; CPU index
  tensors may index a device tensor, as on CUDA, but not the other way round);
- ``.numpy()`` of a device tensor raises :class:`DeviceMixError`;
- a CPU ``torch.Generator`` used to make a device tensor raises :class:`DeviceMixError`;
- every host sync is counted in :attr:`StrictDevice.syncs`, by kind and by call site (the
  innermost frame in ``mhainterp/`` or ``analysis/``): ``.item()``, ``float()``, ``bool()``,
  ``.tolist()``, ``.cpu()``, ``nonzero``, boolean-mask indexing, ``torch.equal``, ``unique``...

It is a check of placement and syncs only: no memory, timing or numerics. Branches on
``device.type == "cuda"`` are not taken (the device says ``lazy``); :func:`cuda_is_strict`
maps the name ``"cuda"`` (``--device cuda``) to it for the commands.

Example::

    with strict_device() as device:
        model = build_model(task, device="cpu").to(DEVICE)
        model(tokens)
    assert device.syncs.total() == 0
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import pkgutil
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("lazy", 0)
"""The simulated device."""

HOST = torch.device("cpu")

PROJECT_DIRS = ("/mhainterp/", "/analysis/")
"""A call site is the innermost frame in one of these folders."""


class DeviceMixError(RuntimeError):
    """What CUDA would have refused."""


# ----------------------------------------------------------------------------- sync counting

#: aten ops that return a value the host reads, with the name a reader knows them by.
SYNC_OPS = {
    "aten._local_scalar_dense.default": "item()",
    "aten.is_nonzero.default": "bool()",
    "aten.equal.default": "torch.equal",
    "aten.allclose.default": "allclose",
    "aten.nonzero.default": "nonzero",
    "aten.masked_select.default": "masked_select",
    "aten._unique2.default": "unique",
    "aten.unique_dim.default": "unique",
    "aten.unique_consecutive.default": "unique",
    "aten.bincount.default": "bincount",
    "aten.repeat_interleave.Tensor": "repeat_interleave",
}
#: ops that return a Python value (nothing to wrap)
SCALAR_RESULTS = {
    "aten._local_scalar_dense.default",
    "aten.is_nonzero.default",
    "aten.equal.default",
    "aten.allclose.default",
}
#: ops that may take tensors on both devices (they move data between them)
COPIES = {
    "aten.copy_.default",
    "aten._to_copy.default",
    "aten._copy_from.default",
    "aten._copy_from_and_resize.default",
    "aten.lift_fresh.default",
}
INDEX_OPS = {
    "aten.index.Tensor",
    "aten.index_put.default",
    "aten.index_put_.default",
    "aten._index_put_impl_.default",
}


def call_site() -> str:
    """``path:line (function)`` of the innermost project frame of the current stack."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename.replace("\\", "/")
        if any(d in name for d in PROJECT_DIRS) and not name.endswith("strict_device.py"):
            short = name.rsplit("/mhainterp/", 1)[-1] if "/mhainterp/" in name else name
            folder = "mhainterp/" if "/mhainterp/" in name else ""
            return f"{folder}{short.rsplit('/analysis/', 1)[-1]}:{frame.lineno} ({frame.name})"
    return "<outside the project>"


class SyncLog:
    """Host syncs by ``(kind, call site)``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def add(self, kind: str) -> None:
        self.counts[(kind, call_site())] += 1

    def reset(self) -> None:
        self.counts.clear()

    def total(self, where: str | None = None) -> int:
        """All syncs, or those whose call site contains ``where`` (a path, a function name)."""
        return sum(n for (_, site), n in self.counts.items() if where is None or where in site)

    def report(self) -> str:
        """One line per call site, most first (for assertion messages)."""
        lines = [f"{self.total()} host syncs"]
        lines += [f"  {n:5d}  {kind:16s} {site}" for (kind, site), n in self.counts.most_common()]
        return "\n".join(lines)


_LOG: SyncLog | None = None  # the active strict_device()'s


def _note_sync(kind: str) -> None:
    if _LOG is not None:
        _LOG.add(kind)


# ----------------------------------------------------------------------------- the tensor


def _is_device(device: Any) -> bool:
    """Whether ``device`` (a torch.device, a name, or None) is :data:`DEVICE`."""
    if isinstance(device, str):
        return device.startswith(DEVICE.type)
    return isinstance(device, torch.device) and device.type == DEVICE.type


def _is_host_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, DeviceTensor)


_REAL_TENSOR = torch.tensor
_REAL_AS_TENSOR = torch.as_tensor


class DeviceTensor(torch.Tensor):
    """A tensor on :data:`DEVICE` whose values live in the CPU tensor ``host``."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> DeviceTensor:
        assert _is_host_tensor(host) and host.device == HOST, (type(host), host.device)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            host.shape,
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            layout=host.layout,
            device=DEVICE,
            requires_grad=host.requires_grad,
        )

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host

    def __repr__(self) -> str:
        return f"DeviceTensor({self.host!r})"

    def tolist(self) -> Any:
        _note_sync(".tolist()")
        return self.host.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise DeviceMixError(
            "can't convert lazy:0 device type tensor to numpy (CUDA: can't convert cuda:0 device "
            "type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.)"
        )

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return self.numpy()

    # Python lists and scalars in an index are turned into tensors by C++ code that the
    # dispatch mode does not see; made here, they take CUDA's path (CPU index tensors, a
    # value on the device).
    def __getitem__(self, index: Any) -> Any:
        return torch.Tensor.__getitem__(self, _index_tensors(index))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, (bool, int, float)):
            value = DeviceTensor(_REAL_TENSOR(value, dtype=self.dtype))
        torch.Tensor.__setitem__(self, _index_tensors(index), value)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _index_tensors(index: Any) -> Any:
    if isinstance(index, list):
        return _REAL_TENSOR(index)
    if isinstance(index, tuple):
        return tuple(_REAL_TENSOR(i) if isinstance(i, list) else i for i in index)
    return index


def _wrap(x: Any) -> Any:
    return DeviceTensor(x) if _is_host_tensor(x) and x.device == HOST else x


def _unwrap(x: Any) -> Any:
    return x.host if isinstance(x, DeviceTensor) else x


# ----------------------------------------------------------------------------- the rules


def _check(name: str, args: tuple, kwargs: dict, flat: list) -> None:
    """Raise :class:`DeviceMixError` where CUDA would refuse the op."""
    on_device = any(isinstance(t, DeviceTensor) for t in flat)
    makes_device = _is_device(kwargs.get("device"))
    generators = [g for g in flat if isinstance(g, torch.Generator)]
    if (on_device or makes_device) and any(g.device == HOST for g in generators):
        raise DeviceMixError(
            f"{name}: a CPU torch.Generator for a device tensor (CUDA: Expected a 'cuda' device "
            "type for generator but found 'cpu')"
        )
    if not on_device or name in COPIES:
        return
    if name in INDEX_OPS:
        indexed, indices = args[0], args[1]
        if _is_host_tensor(indexed) and any(isinstance(i, DeviceTensor) for i in indices):
            raise DeviceMixError(
                f"{name}: device indices into a CPU tensor (CUDA: indices should be either on "
                "cpu or on the same device as the indexed tensor)"
            )
        values = args[2] if len(args) > 2 else None
        if isinstance(indexed, DeviceTensor) and _is_host_tensor(values) and values.dim() > 0:
            raise DeviceMixError(f"{name}: CPU values put into a device tensor")
        return
    mixed = [tuple(t.shape) for t in flat if _is_host_tensor(t) and t.dim() > 0]
    if mixed:
        raise DeviceMixError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"lazy:0 and cpu: {name} got CPU tensors of shapes {mixed}"
        )


def _count(name: str, args: tuple, flat: list) -> None:
    """Note the host syncs an op on device tensors makes."""
    if name in SYNC_OPS:
        _note_sync(SYNC_OPS[name])
    elif name in INDEX_OPS and isinstance(args[0], DeviceTensor):
        if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            _note_sync("boolean index")  # the result's size is read from the device
    elif name == "aten.copy_.default" and _is_host_tensor(args[0]):
        _note_sync("copy to the host")


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """``.to(...)``/``.cpu()``: the one op whose result's device is asked for."""
    source, kw = args[0], dict(kwargs)
    kw.pop("pin_memory", None)
    kw.pop("non_blocking", None)
    target = kw.pop("device", None)
    out = func(_unwrap(source), **kw)
    if _is_device(target) or (target is None and isinstance(source, DeviceTensor)):
        return DeviceTensor(out)
    if isinstance(source, DeviceTensor):
        _note_sync(".cpu()")
    return out


def _run(func: Any, args: tuple, kwargs: dict) -> Any:
    """One aten op: check it, count its syncs, run it on the host values, wrap the result."""
    name = str(func)
    flat = tree_flatten((args, kwargs))[0]
    _check(name, args, kwargs, flat)
    on_device = any(isinstance(t, DeviceTensor) for t in flat)
    if on_device:
        _count(name, args, flat)
    if name == "aten._to_copy.default":
        return _to_copy(func, args, kwargs)
    if name == "aten.is_pinned.default":
        return False
    if name == "aten._pin_memory.default":
        return _unwrap(args[0]).clone()
    kw = dict(kwargs)
    kw.pop("pin_memory", None)
    makes_device = _is_device(kw.get("device"))
    if makes_device:
        kw["device"] = HOST
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kw))
    if name in SCALAR_RESULTS or not (on_device or makes_device):
        return out
    first = args[0] if args else None
    if func._schema.is_mutable and isinstance(first, DeviceTensor) and out is first.host:
        return first  # an in-place op returns its (wrapped) first argument
    if func._schema.is_mutable and _is_host_tensor(first) and out is first:
        return first  # copy_ into a CPU tensor stays on the CPU
    return tree_map(_wrap, out)


class _StrictMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _made_on_device(maker: Any) -> Any:
    """``torch.tensor``/``torch.as_tensor`` that honour ``device=DEVICE``: their C++ builds
    the tensor where the dispatch mode cannot see it."""

    def make(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if isinstance(data, DeviceTensor):
            if device is None or _is_device(device):
                return DeviceTensor(maker(data.host, *args, **kwargs))
            _note_sync(f"torch.{maker.__name__} to {device}")
            return maker(data.host, *args, device=device, **kwargs)
        if _is_device(device):
            return DeviceTensor(maker(data, *args, device=HOST, **kwargs))
        return maker(data, *args, device=device, **kwargs)

    return make


class StrictDevice:
    """What :func:`strict_device` yields: the device and its sync log."""

    def __init__(self) -> None:
        self.device = DEVICE
        self.syncs = SyncLog()

    @property
    def type(self) -> str:
        return DEVICE.type


@contextlib.contextmanager
def strict_device() -> Iterator[StrictDevice]:
    """Inside, :data:`DEVICE` behaves as a CUDA device would, and its host syncs are counted.

    ``torch.cuda`` says there is one GPU (``is_available``, ``device_count``, ``mem_get_info``),
    so code that asks before it moves to a GPU takes the GPU path.
    """
    global _LOG
    state = StrictDevice()
    patches = [
        (torch, "tensor", _made_on_device(_REAL_TENSOR)),
        (torch, "as_tensor", _made_on_device(_REAL_AS_TENSOR)),
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "device_count", lambda: 1),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.cuda, "empty_cache", lambda *a, **k: None),
        (torch.cuda, "get_device_name", lambda *a, **k: "strict simulated device"),
        (torch.cuda, "mem_get_info", lambda *a, **k: (8 * 2**30, 16 * 2**30)),
    ]
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    outer, _LOG = _LOG, state.syncs
    for obj, attr, value in patches:
        setattr(obj, attr, value)
    try:
        with _StrictMode():
            yield state
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
        _LOG = outer


# ----------------------------------------------------------------------------- "cuda" -> DEVICE


@contextlib.contextmanager
def cuda_is_strict(monkeypatch: Any) -> Iterator[None]:
    """``--device cuda`` (and ``"auto"``) resolve to :data:`DEVICE` in every mhainterp module,
    a sweep on it trains in stacked groups, and saved weights load onto it."""
    import mhainterp
    import mhainterp.runtime as runtime
    import mhainterp.sweep.memory as memory
    import mhainterp.training.run_folder as run_folder

    for info in pkgutil.walk_packages(mhainterp.__path__, "mhainterp."):
        if not info.name.endswith("__main__"):
            with contextlib.suppress(ImportError):
                importlib.import_module(info.name)
    real_resolve = runtime.resolve_device
    real_groups, real_memory = memory.trains_in_groups, memory.device_memory
    real_read = run_folder._read_weights

    def resolve_device(device: Any = None) -> torch.device:
        if _is_device(device):
            return DEVICE
        resolved = real_resolve(device)
        return DEVICE if resolved.type == "cuda" else resolved

    def trains_in_groups(device: torch.device) -> bool:
        return _is_device(device) or real_groups(device)

    def device_memory(device: torch.device) -> tuple[int, int]:
        return (8 * 2**30, 16 * 2**30) if _is_device(device) else real_memory(device)

    def read_weights(path: Any, device: Any) -> Any:
        if not _is_device(device):
            return real_read(path, device)
        state, arch = real_read(path, "cpu")  # the file is read on the host, then moved
        return {key: value.to(DEVICE) for key, value in state.items()}, arch

    replace = {
        real_resolve: resolve_device,
        real_groups: trains_in_groups,
        real_memory: device_memory,
        real_read: read_weights,
    }
    for name, module in list(sys.modules.items()):
        if not name.startswith(("mhainterp", "head_count_study", "benchmark")):
            continue
        for attr, value in list(vars(module).items()):
            for real, stand_in in replace.items():
                if value is real:
                    monkeypatch.setattr(module, attr, stand_in)
    yield
