"""A minimal task of one's own: copy the first token to every position.

Everything a task must define is here; sampling, padding, the fixed evaluation set and the checks
come from :class:`mhainterp.tasks.Task`. Use it from the command line::

    mhainterp tasks --task-module analysis/my_task.py
    mhainterp train --task-module analysis/my_task.py --task first_token --out runs/first_token

or from Python with ``mhainterp.tasks.load_task_module("analysis/my_task.py")`` (or simply by
importing a module that calls ``register_task``). Registration checks the task once against the
Task contract (:mod:`mhainterp.tasks.contract`) and refuses it, naming the member, if it breaks it.
"""

from __future__ import annotations

import torch

from mhainterp.tasks import Task, first_position_template, register_task


class FirstTokenTask(Task):
    """Copy the first token: the target at every position t is the token at position 0."""

    name = "first_token"  # the registry name (run folders record it)
    causal = True  # the model may only look back: the answer is always visible

    @property
    def d_vocab_out(self) -> int:
        """Output classes: the target is one of the d_vocab real tokens."""
        return self.d_vocab

    def compute_targets(
        self, tokens: torch.Tensor, padding_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Integer targets ``[n, pos]`` (class ids) and the bool mask of scored positions."""
        targets = tokens[:, :1].expand_as(tokens)  # (n, pos): tokens[:, 0] everywhere
        return targets, padding_mask

    def compute_relations(
        self, tokens: torch.Tensor, padding_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Where the answer lives: a 0/1 template ``[n, q, k]`` per relation."""
        return {"first": first_position_template(tokens, padding_mask)}


register_task("first_token", FirstTokenTask)
