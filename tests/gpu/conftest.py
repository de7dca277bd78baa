"""tests/gpu needs a CUDA device: every test here is skipped where torch sees none."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-check` on a GPU machine)")
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
