"""Shared test settings.

The models under test are tiny: on a 2-core machine torch's default of 2 threads makes their
small matmuls several times slower (thread hand-off dominates), so tests run single-threaded.
"""

import torch

torch.set_num_threads(1)
