"""Test setup: one torch thread per worker (the contract matrix is many tiny ops)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
