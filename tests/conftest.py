"""Shared test settings: deterministic, small, and never touching the user's cache."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # prepared data goes to a per-session temporary cache, never ~/.cache/extrapos
    monkeypatch.setenv("EXTRAPOS_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def pytest_configure(config):
    torch.manual_seed(0)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)  # one thread per worker: two workers share two cores
