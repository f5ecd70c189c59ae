"""The export line of ``extrapos check-encoding`` (tools/conformance.py): the check's model written as a
Hugging Face folder (``write_remote_model``, as ``extrapos export --format remote-code`` writes a run)
and loaded back by transformers, whose logits must equal the model's. It lives here, beside the export,
because the conformance check sits on a lower floor than the integrations."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import torch

from extrapos.tools.conformance import Line

#: loaded in float64 from the folder the export writes: RoPE, ALiBi and NoPE come back exact, the learned
#: table, CABLE and FIRE within 3e-8 (a folder declares float32, and some parameters pass through it);
#: a wrong weight or a missing buffer moves the logits by far more
EXPORT_TOLERANCE = 1e-6


def export_line(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor) -> Line:
    rule = (
        f"exported for transformers and loaded back, the same logits (float64, rel <= {EXPORT_TOLERANCE:g})"
    )
    if importlib.util.find_spec("transformers") is None:
        return Line("export", rule, "transformers is not installed (pip install 'extrapos[hf]')", None)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from extrapos.integrations.hf_remote.export import write_remote_model

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-line check prints no loading bars of a 2-layer model
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "model"
            write_remote_model(model, folder, context=tokens.shape[1], eot_id=None)
            loaded = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64)
            with torch.no_grad():
                got = loaded.eval()(input_ids=tokens, position_ids=positions).logits
                want = model(tokens, positions)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    err = float((got - want).norm() / want.norm().clamp_min(1e-300))
    return Line("export", rule, f"relative error {err:.1e}", err <= EXPORT_TOLERANCE)
