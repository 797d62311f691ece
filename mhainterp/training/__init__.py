"""Training, evaluation, checkpoints and run folders (interim: training.py moved whole into
loop.py so that its history follows the move; the next commit splits it by job)."""

from mhainterp.training.loop import *  # noqa: F403
from mhainterp.training.loop import (  # noqa: F401
    RUN_FILES,
    RunFolderError,
    TrainConfig,
    TrainingDivergedError,
    __all__,
)
