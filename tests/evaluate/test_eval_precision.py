"""Evaluation in bf16 (what `compare` scores in on a GPU with eval_precision = "auto") equals the fp32
evaluation within its tolerance, for the encodings of the papers' first table, under both protocols; and
every result records the precision it was scored in."""

from __future__ import annotations

import pytest

from extrapos.compare.facts import _evaluation_fact, precision_of
from extrapos.compare.sweep import Sweep
from extrapos.evaluate import EvalRequest, evaluate
from extrapos.run.config import load_config
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

ENCODINGS = ["nope", "rope", "alibi", "cable", "expe"]
#: bf16 keeps 8 bits of mantissa (a relative rounding of 2^-9 = 2e-3 per operation); the per-token losses
#: are computed in fp32 from bf16 logits, and a mean over hundreds of tokens averages their rounding.
#: Measured on this machine (AVX512, these runs: 30 steps, losses ~5.3 nats): at most 3.0e-4 nats between
#: the bf16 and fp32 means over every encoding, length and protocol here (median 7e-5). The tolerance,
#: 5e-3 nats, is 17x that, and a twentieth of the ~0.1 nats between rows the papers' tables discuss.
MEAN_TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("precision-runs")
    for name in ENCODINGS:
        sets = tiny_overrides(tiny_data, **{"model.positions.name": name, "train.steps": 30})
        train(load_config("cpu/tiny", sets), root / name, progress=False)
    return root


@pytest.mark.parametrize("protocol", [{"protocol": "documents"}, {"protocol": "stream", "boundary": "mask"}])
def test_bf16_evaluation_equals_fp32_within_its_tolerance(runs, protocol):
    for name in ENCODINGS:
        results = {
            p: evaluate(
                runs / name,
                EvalRequest(lengths=[1, 2, 4], max_tokens=512, precision=p, **protocol),
                progress=False,
            )
            for p in ("fp32", "bf16")
        }
        fp32, bf16 = (results[p] for p in ("fp32", "bf16"))
        assert fp32["precision"] == "fp32" and bf16["precision"] == "bf16"
        assert bf16["request"]["precision"] == "bf16" and bf16["name"].endswith("-bf16")  # its own file
        for a, b in zip(fp32["results"], bf16["results"]):
            assert a["ev"] == b["ev"] and a["targets"] == b["targets"]  # the same targets, scored twice
            assert a["loss"] != b["loss"]  # bf16 did run: its rounding shows
            assert abs(a["loss"] - b["loss"]) < MEAN_TOLERANCE, (name, a["ev"], a["loss"], b["loss"])


def test_compare_resolves_auto_and_states_the_precision():
    assert Sweep(eval_precision="auto").eval_precision_on("cpu") == "fp32"  # bf16 is emulated on most CPUs
    assert Sweep(eval_precision="bf16").eval_precision_on("cpu") == "bf16"
    assert Sweep().eval_request([1], {}, 100).precision == "fp32"  # the default, as every sweep before
    stream = {
        "protocol": "stream",
        "boundary": "cross",
        "documents_in_split": 3,
        "stream_tokens": 900,
        "target_tokens": 64,
        "blocks": 2,
        "block": 32,
        "documents_used": 2,
    }
    assert _evaluation_fact({**stream, "precision": "bf16"}).endswith(
        "scored in bf16 autocast, losses in fp32"
    )
    # results written before the field existed: their request's precision, else fp32
    assert precision_of({"request": {"precision": "bf16"}}) == "bf16" and precision_of({}) == "fp32"
