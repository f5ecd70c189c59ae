"""An exported folder loads where extrapos cannot be imported (issue 46): its Python files carry the
library's code they run (integrations/hf_remote/vendor.py). For every registered encoding, a layer
schedule and an encoder, one subprocess that blocks `import extrapos` loads each folder with
transformers' Auto classes, and the logits, the cached greedy tokens, and a training step's loss and
gradients equal extrapos' own, computed here (a save_pretrained of a few loads again with the same
logits); the tokenizer is transformers' own fast tokenizer, with no code of the folder's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from extrapos.inference.generate import generate_tokens  # noqa: E402
from extrapos.integrations.hf_remote.vendor import ALLOWED, folder_code  # noqa: E402
from extrapos.positions.registry import names, spec  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import CONTEXT, VOCAB, ours_logits  # noqa: E402
from tests.integrations.test_hf_remote_code import CASES, L, _export  # noqa: E402

TOL = 1e-5  # fp32
NEW = 12  # greedy tokens generated past a prompt longer than the training length
ROOT = Path(__file__).resolve().parents[2]

# a meta-path finder that refuses extrapos, whatever sys.path and the editable install's .pth hold
BLOCK = """
import importlib.abc, sys

class NoExtrapos(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "extrapos" or name.startswith("extrapos."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoExtrapos())
sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p, "extrapos"))]
try:
    import extrapos  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("extrapos is still importable")
"""

CHILD = (
    "import contextlib, io, json, os, sys\n"
    + BLOCK
    + """
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

jobs = json.loads(open(sys.argv[1]).read())
out = {}
for name, job in jobs.items():
    folder, tokens = job["folder"], torch.tensor(job["tokens"])
    auto = AutoModelForCausalLM if job["causal"] else AutoModelForMaskedLM
    model = auto.from_pretrained(folder, trust_remote_code=True).eval()
    got = {"module": type(model).__module__}
    with torch.no_grad():
        got["logits"] = model(tokens).logits
    if job["causal"]:
        model.generation_config.eos_token_id = None
        prompt = tokens[:1, : job["prompt"]]
        with torch.no_grad():  # generate's own loop, through the folder's KV cache; no padding in the prompt
            done = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=job["new"],
                                  min_new_tokens=job["new"], do_sample=False, pad_token_id=0, use_cache=True)
        got["greedy"] = done[0, prompt.shape[1]:].tolist()
    model.train()  # one training step: the loss and every gradient
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    got["loss"] = loss.detach()
    got["grads"] = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    if job["save"]:
        saved = os.path.join(job["scratch"], "saved")
        model.save_pretrained(saved)  # the folder's own files, written by its own code
        again = auto.from_pretrained(saved, trust_remote_code=True).eval()
        with torch.no_grad():
            got["saved_equal"] = bool(torch.equal(again(tokens).logits, got["logits"]))
    out[name] = got

tok = {}
asked = {"refused": {"trust_remote_code": False}, "trusted": {"trust_remote_code": True}, "plain": {}}
for label, kwargs in asked.items():
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):  # a question about remote code is written here (stdin is closed)
        t = AutoTokenizer.from_pretrained(jobs[next(iter(jobs))]["folder"], **kwargs)
    tok[label] = {"module": type(t).__module__, "ids": t(sys.argv[3])["input_ids"], "shown": shown.getvalue()}
out["tokenizer"] = tok
out["extrapos_modules"] = sorted(m for m in sys.modules if m == "extrapos" or m.startswith("extrapos."))
torch.save(out, sys.argv[2])
"""
)

ENCODER = dict(flavour="encoder", positions={"name": "t5"})
SAVED = ("cable", "dape", "schedule-rope-nope", "encoder-t5")  # save_pretrained and load again
# by default: a folded bias, an encoding built inside another, a gated state, rotation, a schedule, the
# llama block with grouped-query attention and an encoder
SOME = ("cable", "dape", "fox", "rope", "schedule-rope-nope", "alibi-llama", "encoder-t5")


def _reference(run_dir: Path, tokens: torch.Tensor, causal: bool) -> dict:
    """extrapos' own logits, greedy tokens, loss and gradients (named as the folder's model names them)."""
    run = load_run(run_dir)
    model = run.model
    ref: dict = {"logits": ours_logits(model, tokens)}
    if causal:
        ref["greedy"] = list(generate_tokens(model, tokens[0, : CONTEXT + 10].tolist(), NEW, temperature=0.0))
    model.train()
    logits = model(tokens, torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1))
    if causal:
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    else:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
    loss.backward()
    ref["loss"] = loss.detach()
    ref["grads"] = {f"model.{k}": p.grad for k, p in model.named_parameters() if p.grad is not None}
    return ref


@pytest.mark.parametrize("which", ["some", pytest.param("every", marks=pytest.mark.slow)])
def test_every_encoding_loads_generates_and_trains_where_extrapos_cannot_be_imported(tmp_path, which):
    """``every``: each registered encoding, a layer schedule, Llama-flavour ALiBi and an encoder (about 70
    CPU seconds, pytest -m slow); ``some``: one of each family of code paths, by default."""
    cases = {name: CASES[name] for name in names()}  # every registered encoding on its own
    cases["schedule-rope-nope"] = CASES["schedule-rope-nope"]
    cases["alibi-llama"] = CASES["alibi-llama"]
    cases["encoder-t5"] = ENCODER
    if which == "some":
        cases = {name: options for name, options in cases.items() if name in SOME}
    jobs, refs = {}, {}
    for i, (name, options) in enumerate(cases.items()):
        base = tmp_path / f"c{i}"
        folder = _export(base, **options)
        causal = options.get("flavour") != "encoder"
        torch.manual_seed(i)
        tokens = torch.randint(0, VOCAB, (2, L if causal else 48))
        jobs[name] = dict(
            folder=str(folder),
            tokens=tokens.tolist(),
            causal=causal,
            prompt=CONTEXT + 10,
            new=NEW,
            scratch=str(base),
            save=name in SAVED,
        )
        refs[name] = _reference(base / "run", tokens, causal)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    text = "Fellow citizens of the Senate"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "jobs.json"), str(tmp_path / "out.pt"), text],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")},
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    assert out["extrapos_modules"] == []
    for name, ref in refs.items():
        got = out[name]
        assert got["module"].startswith("transformers_modules."), name  # the folder's own code ran
        assert ref["logits"].std() > 0.3, name
        assert (got["logits"] - ref["logits"]).abs().max() < TOL, name
        if "greedy" in ref:
            assert got["greedy"] == ref["greedy"], name
        assert abs(float(got["loss"]) - float(ref["loss"])) < TOL, name
        assert set(got["grads"]) == set(ref["grads"]) and ref["grads"], name
        for key, grad in ref["grads"].items():
            assert (got["grads"][key] - grad).abs().max() < TOL, (name, key)
        if name in SAVED:
            assert got["saved_equal"], name
    # the tokenizer: transformers' own fast tokenizer, the run's ids, and no code of the folder's
    folder = Path(jobs[next(iter(jobs))]["folder"])
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (
        tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
        and "auto_map" not in tokenizer_config
    )
    assert "AutoTokenizer" not in json.loads((folder / "config.json").read_text())["auto_map"]
    want = load_run(tmp_path / "c0" / "run").tokenizer.encode(text)
    for label, tok in out["tokenizer"].items():
        assert tok["module"].startswith("transformers."), label
        assert tok["ids"] == want, label
    # transformers asks about the model's code while AutoTokenizer reads config.json unless told; told
    # either way, it asks nothing (a plain call loads the same tokenizer once the question goes unanswered)
    assert out["tokenizer"]["refused"]["shown"] == "" and out["tokenizer"]["trusted"]["shown"] == ""


@pytest.mark.parametrize("name", ["rope", "cable", "fox"])
def test_the_folders_code_imports_only_torch_transformers_and_the_standard_library(name):
    """What transformers' check_imports reads in each file (every import outside try blocks) is a package
    the folder may require; the copies import each other relatively, and never extrapos."""
    import ast

    files = folder_code([spec(name).cls])
    assert "modeling_extrapos.py" in files and "configuration_extrapos.py" in files
    for file, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            assert all(t in ALLOWED and t != "extrapos" for t in tops), (file, ast.unparse(node))
    # provenance: the version and commit that wrote the folder, and each copy's library file
    from extrapos import __version__

    record: dict = {}
    exec(files["extrapos_provenance.py"], record)
    assert record["__version__"] == __version__ and "COMMIT" in record
    assert set(record["SOURCES"]) == set(files) - {"extrapos_provenance.py"}
    assert record["SOURCES"]["modeling_extrapos.py"] == "extrapos/integrations/hf_remote/modeling.py"
    for file, source in record["SOURCES"].items():
        assert files[file].startswith(f"# {source}, copied into this model folder"), file
        assert (ROOT / "src" / source).is_file(), source
    # the model's code only: no data pipeline, run directory, training, tokenizer or command
    for unit in ("data", "run", "training", "evaluate", "inference", "cli", "plugins", "auto_registration"):
        assert not any(f.startswith(f"extrapos_{unit}") for f in files), unit
    integrations = {f for f in files if f.startswith("extrapos_integrations")}
    assert integrations == {
        "extrapos_integrations_hf_remote_cache.py",
        "extrapos_integrations_hf_remote_copy_code.py",
    }


PLUGIN = """
import math
{line}
from extrapos.positions.base import PositionalEncoding


class Enc(PositionalEncoding):
    pass
"""


@pytest.mark.parametrize(
    "line, refusal",
    [
        ("import numpy", "imports numpy, which the exported folder cannot require"),
        ("import extrapos.positions.base as base", "imports the module extrapos.positions.base"),
        ("from extrapos import positions", "imports positions from extrapos itself"),
        ("from extrapos.positions import base", "imports the module extrapos.positions.base"),
        ("", None),  # the same module without the line is copied, as plugin_<its dotted name>.py
    ],
)
def test_an_import_the_folder_cannot_carry_fails_the_export_naming_its_line(
    tmp_path, monkeypatch, line, refusal
):
    """A module the model runs (here a plug-in's encoding) that imports a package outside the standard
    library, torch and transformers, or an extrapos module as an object (transformers would not copy
    it), is refused with its file and line, not written into a folder that fails where it loads."""
    import importlib

    from extrapos.integrations.hf_remote.vendor import VendorError

    package = tmp_path / "toyenc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "enc.py").write_text(PLUGIN.format(line=line))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = importlib.import_module("toyenc.enc").Enc
        if refusal is None:
            files = folder_code([cls])
            assert "from .extrapos_positions_base import PositionalEncoding" in files["plugin_toyenc_enc.py"]
            assert "from .plugin_toyenc_enc import Enc" in files["extrapos_positions_registry.py"]
            return
        with pytest.raises(VendorError, match=refusal) as caught:
            folder_code([cls])
        assert f"{package / 'enc.py'}:3" in str(caught.value)
    finally:  # imported from this test's folder: forgotten after it
        for name in ("toyenc", "toyenc.enc"):
            sys.modules.pop(name, None)
