"""Train a model on a task, evaluate it, keep its checkpoints, save and load its run folder.

One module per job (lower ones first; a module imports only those above it in this list):

``memory``       what training needs in memory, estimated before anything is allocated
                 (:func:`count_parameters`, :func:`training_memory`, ...)
``evaluation``   :func:`evaluate`: loss and accuracy on a task's fixed evaluation set
``identity``     which run a folder holds: a run's ``config.json`` content and its comparison
                 with a planned run (:func:`saved_config_matches`, :func:`run_identity`, ...)
``run_folder``   the run folder: :func:`save_run`, :func:`load_run` -> :class:`Run`,
                 :func:`check_run_folder` (from the files, no weights loaded),
                 :func:`run_folder_state`, :data:`ARCHITECTURE_FIELDS`
``checkpoints``  the training state an interrupted run resumes from (:func:`write_checkpoint`,
                 :func:`read_checkpoint`, :data:`CHECKPOINT_SECONDS`)
``loop``         :func:`build_model`, :func:`train` (the loop, resume, divergence:
                 :func:`save_diverged`), :func:`lr_at`, :func:`check_compatible`

The package sits above errors/validation/runtime/io/config, the model and
tasks/data/scoring/runs (DESIGN.md's order), and imports nothing above them: the sweep, the
fast paths and the analyses import it, never the other way round.

Example:
    >>> from mhainterp.config import TrainConfig
    >>> from mhainterp.tasks import get_task
    >>> task = get_task("reverse", seq_len=6, d_vocab=4)
    >>> run = train(build_model(task, d_model=8, n_heads=2, device="cpu"), task,
    ...             TrainConfig(steps=4, batch_size=8, n_eval=16), progress=False)
    >>> run.eval["status"], int(run.metrics["step"].iloc[-1])
    ('finished', 4)

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``data``, ``errors``, ``io``, ``model``, ``runs``, ``runtime``,
``scoring``, ``tasks``, ``validation``.
"""

from mhainterp.training.checkpoints import CHECKPOINT_SECONDS, read_checkpoint, write_checkpoint
from mhainterp.training.evaluation import EVAL_BATCH_SIZE, evaluate
from mhainterp.training.identity import (
    run_config_differences,
    run_identity,
    saved_config_matches,
)
from mhainterp.training.loop import build_model, check_compatible, lr_at, save_diverged, train
from mhainterp.training.memory import (
    count_parameters,
    itemsize,
    training_memory,
    training_what,
)
from mhainterp.training.run_folder import (
    ARCHITECTURE_FIELDS,
    Run,
    check_run_folder,
    load_run,
    run_folder_state,
    save_run,
)

__all__ = [
    "EVAL_BATCH_SIZE",
    "ARCHITECTURE_FIELDS",
    "Run",
    "build_model",
    "train",
    "evaluate",
    "save_run",
    "load_run",
    "check_run_folder",
    "run_folder_state",
    "run_config_differences",
    "saved_config_matches",
    "lr_at",
    "count_parameters",
    "itemsize",
    "training_memory",
    "training_what",
    "run_identity",
    "write_checkpoint",
    "read_checkpoint",
    "CHECKPOINT_SECONDS",
    "check_compatible",
    "save_diverged",
]
