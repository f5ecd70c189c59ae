"""A config.json with both ``rope_parameters`` and ``rope_scaling`` imports as transformers 5 reads it
(issue 48, item 2).

transformers 5 writes ``rope_parameters``; model cards tell users to add a top-level ``rope_scaling``, and
transformers 5 then reads ``rope_scaling`` in place of ``rope_parameters`` (``convert_rope_params_to_dict``:
``rope_scaling or rope_parameters``, rope_theta from the top level or 10000). ``extrapos import`` used to
read ``rope_parameters`` alone: plain RoPE where transformers applies linear x4, and whatever
``rope_scaling`` held (a factor of 1e30) passed unchecked. Now it reads the same section, refuses a
``rope_parameters`` value that transformers would silently drop (a conflict), and bounds every value.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from extrapos.errors import UserError
from extrapos.integrations.hf import import_pretrained
from extrapos.integrations.hf.rope import rope_options_from_hf
from extrapos.run.directory import load_run
from tests.integrations.hf_helpers import CONTEXT, VOCAB, hf_logits, ours_logits, save_hf

LINEAR_X4 = {"rope_type": "linear", "factor": 4.0}


def _with_rope_scaling(directory, rope_scaling):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    assert config.get("rope_parameters"), "transformers 5 writes rope_parameters"
    path.write_text(json.dumps({**config, "rope_scaling": rope_scaling}))
    return config


def test_rope_scaling_beside_rope_parameters_imports_as_transformers_reads_it(tmp_path):
    import transformers as T

    save_hf("llama", tmp_path / "hf")
    _with_rope_scaling(tmp_path / "hf", LINEAR_X4)
    hf = T.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").float().eval()
    assert hf.config.rope_parameters["rope_type"] == "linear"  # what transformers makes of the file
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    assert run.cfg.model.positions["scaling"] == "linear" and run.cfg.model.positions["factor"] == 4.0
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (1, 4 * CONTEXT))
    assert (ours_logits(run.model, tokens) - hf_logits(hf, tokens)).abs().max() < 1e-4


HF = {"max_position_embeddings": 32}
DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


def test_plain_rope_parameters_give_way_to_rope_scaling():
    opts = rope_options_from_hf({**HF, "rope_parameters": DEFAULT, "rope_scaling": LINEAR_X4}, 16)
    assert (opts["scaling"], opts["factor"], opts["base"]) == ("linear", 4.0, 10000.0)
    # the same values in both sections, or an empty rope_scaling, are no conflict
    same = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    assert rope_options_from_hf({**HF, "rope_parameters": same, "rope_scaling": LINEAR_X4}, 16) == opts
    plain = rope_options_from_hf({**HF, "rope_parameters": DEFAULT, "rope_scaling": {}}, 16)
    assert "scaling" not in plain


CONFLICTS = {
    "two factors": ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, ["factor", "2.0", "4.0"]),
    "two types": (
        {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 8},
        ["rope_type", "yarn", "linear"],
    ),
    # transformers reads rope_theta from rope_scaling or the top level (10000 when neither has it)
    "a theta transformers drops": (
        {"rope_type": "default", "rope_theta": 500000.0},
        ["rope_theta", "500000"],
    ),
}


@pytest.mark.parametrize("case", list(CONFLICTS))
def test_a_conflict_between_the_sections_is_one_sentence(case):
    params, fragments = CONFLICTS[case]
    with pytest.raises(UserError) as e:
        rope_options_from_hf({**HF, "rope_parameters": params, "rope_scaling": LINEAR_X4}, 16)
    sentence = str(e.value)
    assert "rope_scaling" in sentence and "rope_parameters" in sentence and sentence.count(". ") == 0
    for fragment in fragments:
        assert fragment in sentence, sentence


@pytest.mark.parametrize("factor", [1e30, float("inf")])
def test_rope_scaling_beside_rope_parameters_is_bounded(factor):
    with pytest.raises(UserError, match=r"rope_scaling\.factor"):
        rope_options_from_hf(
            {**HF, "rope_parameters": DEFAULT, "rope_scaling": {"rope_type": "linear", "factor": factor}}, 16
        )
