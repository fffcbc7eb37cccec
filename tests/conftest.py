import os
import warnings

import pytest
import torch

os.environ.setdefault("PL_DISABLE_FORK", "1")
torch.set_num_threads(1)  # small models train fastest on one thread; no oversubscription


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        yield
