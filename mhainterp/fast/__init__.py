"""Derived fast paths: fenced copies of parts of :mod:`mhainterp.model`, each tested equal to it.

- :mod:`mhainterp.fast.stacked`: train many same-shaped models in one batched step
  (``train_many``; ``tests/test_batched.py`` proves logits, gradients and whole runs equal).
  Its parts: :mod:`~mhainterp.fast.stacked_params` (the ``[M, P]`` buffer, laid out from
  ``named_parameters()``), :mod:`~mhainterp.fast.stacked_forward` (the batched forward/loss),
  :mod:`~mhainterp.fast.stacked_buffers` (on the CPU, its largest activations in buffers kept
  from step to step, bit for bit the plain ops: ``tests/test_stacked_bitwise.py``) and
  :mod:`~mhainterp.fast.stacked_memory` (its device memory per model, traced on the meta
  device). It trains on the models' device, the CPU or a GPU (``tests/test_gpu.py``).
- :mod:`mhainterp.fast.linear_readout`: score many ablated copies through ``W_O[h] @ W_U`` when
  the readout after ``hook_z`` is linear (``tests/test_ablation.py`` proves tables equal).

``model.py`` (with its layers in ``components.py``) is the one reference forward; a change to
it names these modules in its commit.

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``errors``, ``model``, ``protocol``, ``runtime``,
``tasks``, ``training``, ``validation``.
"""
