"""``train.compile``: the training step compiled with inductor (the C++ backend on a CPU) trains to eager's
losses, in one graph with no graph break (a break per layer cost the cpu/medium preset's steps), resumes from
its checkpoints, and still refuses document numbers out of order inside the compiled graph."""

from __future__ import annotations

import pytest
import torch

from extrapos.model import Decoder, ModelConfig
from extrapos.run.config import load_config
from extrapos.training import trainer as train_mod
from tests.conftest import tiny_overrides

PACKED_MASKED = {
    "data.packed": "true",
    "data.document_mask": "true",
    "data.document_positions": '"restart"',
    "model.positions.name": '"alibi"',
}


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in train_mod.read_metrics(run_dir) if "loss" in m]


def test_a_compiled_step_trains_to_eagers_losses_in_one_graph_and_resumes(tiny_data, tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    sets = tiny_overrides(tiny_data, **PACKED_MASKED, **{"train.steps": 4, "train.checkpoint_every": 2})
    compiled_cfg = load_config("cpu/tiny", [*sets, "train.compile=true"])
    train_mod.train(compiled_cfg, tmp_path / "compiled", progress=False)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    train_mod.train(load_config("cpu/tiny", sets), tmp_path / "eager", progress=False)
    compiled, eager = losses(tmp_path / "compiled"), losses(tmp_path / "eager")
    assert [s for s, _ in compiled] == [1, 2, 3, 4] and [s for s, _ in eager] == [1, 2, 3, 4]
    # inductor fuses and reorders the same float32 arithmetic: equal to rounding, not bit for bit
    assert [loss for _, loss in compiled] == pytest.approx([loss for _, loss in eager], rel=1e-5)
    # the checkpoint holds the model's own names (not the compiled wrapper's), so a compiled run resumes
    more = load_config("cpu/tiny", [*sets, "train.compile=true", "train.steps=6"])
    train_mod.train(more, tmp_path / "compiled", resume=True, progress=False)
    assert [s for s, _ in losses(tmp_path / "compiled")] == [1, 2, 3, 4, 5, 6]


def test_a_compiled_forward_refuses_documents_out_of_order():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, vocab_size=64, train_length=8)
    model = torch.compile(Decoder(cfg))
    tokens, positions = torch.randint(0, 64, (1, 8)), torch.arange(8).unsqueeze(0)
    ordered = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2]])
    assert torch.isfinite(model(tokens, positions, documents=ordered)).all()
    with pytest.raises(RuntimeError, match="must not decrease"):
        model(tokens, positions, documents=ordered.flip(-1))
