"""`extrapos export --format remote-code`: every encoding and layer schedule as a Hugging Face folder that
transformers' Auto classes load (trust_remote_code=True, or after `import extrapos`), with extrapos'
logits, its greedy tokens through `generate` and its KV cache, lm-eval's `hf` backend's answers, and
a `save_pretrained` that loads again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from extrapos.bench.peers import hf_cache_name  # noqa: E402
from extrapos.inference.generate import generate_tokens  # noqa: E402
from extrapos.integrations.hf import export_pretrained  # noqa: E402
from extrapos.positions.registry import names  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import CONTEXT, VOCAB, hf_greedy, make_run, ours_cached_logits, ours_logits  # noqa: E402

TOL = 1e-5  # fp32
L = 4 * CONTEXT
ROOT = Path(__file__).resolve().parents[2]

# every registered encoding on its own (learned: a table as long as the longest test), plus the runs the
# issue names: a layer schedule (SmolLM3-style NoPE on every 4th layer) and Llama-flavour ALiBi
CASES = {name: dict(positions={"name": name}) for name in names()}
CASES["learned"] = dict(positions={"name": "learned", "max_length": L})
CASES["schedule-rope-nope"] = dict(
    n_layers=4, positions={"name": "rope", "layers": "all but every 4th", "others": {"name": "nope"}}
)
CASES["schedule-cable-t5"] = dict(positions={"name": "cable", "layers": [1], "others": {"name": "t5"}})
CASES["alibi-llama"] = dict(flavour="llama", n_kv_heads=2, positions={"name": "alibi"}, tie_embeddings=False)
FAST = ("cable", "expe", "fire", "schedule-rope-nope", "alibi-llama")  # the rest: pytest -m slow


def _export(tmp_path, **options) -> Path:
    run = make_run(tmp_path / "run", **options)
    if options.get("flavour") == "encoder":  # make_run writes a decoder's training section
        toml = (run / "config.toml").read_text()
        assert "objective" not in toml and "\n[train]\n" in toml
        (run / "config.toml").write_text(toml.replace("\n[train]\n", '\n[train]\nobjective = "mlm"\n'))
    return export_pretrained(run, tmp_path / "hf", remote_code=True)


def _hf_cached(model, tokens, first):
    """transformers-style incremental decoding: prefill, then one token at a time through the cache."""
    name = hf_cache_name(model)
    with torch.no_grad():
        out = model(tokens[:, :first], use_cache=True)
        logits, past = [out.logits], getattr(out, name)
        for s in range(first, tokens.shape[1]):
            out = model(tokens[:, s : s + 1], use_cache=True, **{name: past})
            logits.append(out.logits)
            past = getattr(out, name)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_remote_code_export_matches(case, tmp_path):
    out = _export(tmp_path, **CASES[case])
    run = load_run(tmp_path / "run")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert hf.config.model_type == "extrapos" and type(hf).__name__ == "ExtraposForCausalLM"
    torch.manual_seed(2)
    tokens = torch.randint(0, VOCAB, (2, L))
    with torch.no_grad():
        ref = hf(tokens).logits
    assert ref.std() > 0.3
    assert (ours_logits(run.model, tokens) - ref).abs().max() < TOL
    first = CONTEXT // 2  # the cache, one token at a time, as transformers' decoding loop feeds it
    ours_steps = ours_cached_logits(run.model, tokens[:1], first=first, chunk=1)
    assert (ours_steps - _hf_cached(hf, tokens[:1], first)).abs().max() < TOL
    prompt = tokens[0, : CONTEXT + 10].tolist()  # greedy decoding past the training length
    assert list(generate_tokens(run.model, prompt, 30, temperature=0.0)) == hf_greedy(hf, prompt, 30)


def test_left_padded_prompts_generate_what_each_prompt_generates_alone(tmp_path):
    """A batch of prompts of different lengths, left-padded with an attention mask (what lm-eval and
    pipelines pass): each row's tokens equal that prompt's own greedy tokens."""
    out = _export(tmp_path, positions={"name": "fox"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    torch.manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,)).tolist() for n in (12, 5, 9)]
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        batch = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    for row, p in zip(batch[:, longest:].tolist(), prompts):
        assert row == hf_greedy(hf, p, 8)


def test_registered_after_import_extrapos_without_trust_remote_code(tmp_path):
    """This process imported extrapos: the Auto classes know model_type extrapos, no remote code runs."""
    from extrapos.integrations.hf_remote.modeling import ExtraposForCausalLM, ExtraposModel

    out = _export(tmp_path, positions={"name": "kerple-log"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(hf) is ExtraposForCausalLM
    assert type(transformers.AutoModel.from_pretrained(out)) is ExtraposModel
    run = load_run(tmp_path / "run")
    tokens = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        assert (hf(tokens).logits - ours_logits(run.model, tokens)).abs().max() < TOL


FRESH = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokens = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    logits = model(tokens).logits
model.generation_config.eos_token_id = None
greedy = model.generate(tokens[:1, :20], max_new_tokens=10, do_sample=False, pad_token_id=0)[0, 20:]
library = sorted(m for m in sys.modules if m == "extrapos" or m.startswith("extrapos."))
print(json.dumps({"logits": logits.tolist(), "greedy": greedy.tolist(), "class": type(model).__module__,
                  "library": library}))
"""


def _python(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_fresh_process_loads_it_with_only_transformers_in_its_code(tmp_path):
    """The user's code imports transformers alone, where extrapos is installed: the folder's own files
    build the model, and import nothing of the installed library (the two never mix)."""
    out = _export(tmp_path, positions={"name": "cable"})
    run = load_run(tmp_path / "run")
    torch.manual_seed(4)
    tokens = torch.randint(0, VOCAB, (2, 48))
    got = json.loads(_python(FRESH, str(out), json.dumps(tokens.tolist())))
    assert got["class"].startswith("transformers_modules")  # the folder's modeling_extrapos.py
    assert got["library"] == []
    assert (torch.tensor(got["logits"]) - ours_logits(run.model, tokens)).abs().max() < TOL
    want = list(generate_tokens(run.model, tokens[0, :20].tolist(), 10, temperature=0.0))
    assert got["greedy"] == want


def test_import_extrapos_leaves_transformers_unimported_and_registers_when_it_loads(tmp_path):
    out = _export(tmp_path, positions={"name": "expe"})
    code = """
import sys
import extrapos
assert "transformers" not in sys.modules, "import extrapos imported transformers"
from transformers import AutoModelForCausalLM
print(type(AutoModelForCausalLM.from_pretrained(sys.argv[1])).__module__)
"""
    assert _python(code, str(out)) == "extrapos.integrations.hf_remote.modeling"


def test_save_pretrained_of_the_loaded_model_round_trips(tmp_path):
    out = _export(tmp_path, positions={"name": "fire"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    hf.save_pretrained(tmp_path / "saved")
    saved = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"config.json", "model.safetensors", "configuration_extrapos.py", "modeling_extrapos.py"} <= saved
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_extrapos.ExtraposForCausalLM"
    assert config["extrapos_model"] == json.loads((out / "config.json").read_text())["extrapos_model"]
    again = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "saved", trust_remote_code=True
    ).eval()
    tokens = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, hf(tokens).logits)


def test_an_encoder_exports_as_automodel_and_masked_lm(tmp_path):
    out = _export(tmp_path, flavour="encoder", positions={"name": "alibi"})
    run = load_run(tmp_path / "run")
    config = json.loads((out / "config.json").read_text())
    assert "AutoModelForMaskedLM" in config["auto_map"] and "AutoModelForCausalLM" not in config["auto_map"]
    tokens = torch.randint(0, VOCAB, (2, 24))
    pos = torch.arange(24).expand(2, -1)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    base = transformers.AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        assert (mlm(tokens).logits - run.model(tokens, pos)).abs().max() < TOL
        assert (base(tokens).last_hidden_state - run.model.hidden_states(tokens, pos)).abs().max() < TOL
    with pytest.raises(ValueError, match="AutoModelForMaskedLM"):
        transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)


@pytest.mark.parametrize("bars", [True, False])
def test_the_export_draws_no_progress_bar_and_leaves_the_setting_as_it_was(bars, tmp_path, capsys):
    """save_pretrained's "Writing model shards" bar came before an export's line, and before the one sentence
    of an export that failed (issue 48): it is off while the folder is written, the caller's setting back."""
    from transformers.utils import logging as hf_logging

    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    try:
        _export(tmp_path, positions={"name": "rope"})
        assert hf_logging.is_progress_bar_enabled() is bars
    finally:
        hf_logging.enable_progress_bar()
    assert "Writing model shards" not in capsys.readouterr().err


def test_the_cli_exports_remote_code_and_the_default_names_it(tmp_path, capsys):
    from extrapos.cli import main

    make_run(tmp_path / "run", positions={"name": "cable"})
    hf = ["--format", "hf"]
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "native"), *hf]) == 2
    assert "export it with --format remote-code" in capsys.readouterr().err
    assert not (tmp_path / "native").exists()
    # the default (auto) writes remote code where no native architecture holds the run, and says so
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "auto")]) == 0
    assert "no native Hugging Face architecture" in capsys.readouterr().out
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["model_type"] == "extrapos"
    remote = ["--format", "remote-code"]
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), *remote]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert "extrapos.json" in files  # the run and step it came from
    # a run a native architecture holds is still written natively unless remote code is asked for
    make_run(tmp_path / "rope", flavour="llama")
    assert main(["export", str(tmp_path / "rope"), "--out", str(tmp_path / "llama")]) == 0
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    assert main(["export", str(tmp_path / "rope"), "--out", str(tmp_path / "forced"), *remote]) == 0
    assert json.loads((tmp_path / "forced" / "config.json").read_text())["model_type"] == "extrapos"


@pytest.mark.slow  # lm-eval's task loading and evaluator twice: about 10 s
def test_lm_eval_hf_backend_equals_extrapos_lm_eval(tmp_path):
    """lm-eval's own `hf` backend on the exported folder answers every request as `extrapos lm-eval` does
    on the run (log-likelihoods to 1e-4 with its batching, greedy texts exactly: left-padded prompts)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from extrapos.integrations.lm_eval import run_lm_eval
    from tests.integrations.test_lm_eval import CHOICE_DOCS, GEN_DOCS, TEXT_DOCS, YAML

    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    for name, docs in (("choice", CHOICE_DOCS), ("text", TEXT_DOCS), ("gen", GEN_DOCS)):
        (tasks_dir / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    for name, text in YAML.items():
        (tasks_dir / f"{name}.yaml").write_text(text.format(dir=tasks_dir))
    out = _export(tmp_path, positions={"name": "cable"})
    tasks = ["xp_choice", "xp_rolling", "xp_gen"]
    ours = run_lm_eval(
        tmp_path / "run", tasks, include_path=tasks_dir, include_defaults=False, max_length=128, batch_size=2,
        log_samples=True, quiet=True,
    )  # fmt: skip
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={out},trust_remote_code=True,dtype=float32,max_length=128",
        tasks=tasks,
        batch_size=2,
        device="cpu",
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    for task in tasks:
        a = [s["resps"] for s in ours["samples"][task]]
        b = [s["resps"] for s in theirs["samples"][task]]
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            for rx, ry in zip(x, y):
                if isinstance(rx[0], str):  # generate_until: the text
                    assert rx == list(ry)
                else:  # (log-likelihood, is_greedy) or a rolling log-likelihood
                    rx, ry = (rx[0], ry[0]) if isinstance(rx[0], (list, tuple)) else (rx, ry)
                    rx, ry = (list(rx), list(ry)) if isinstance(rx, (list, tuple)) else ([rx], [ry])
                    assert float(rx[0]) == pytest.approx(float(ry[0]), abs=1e-4)
                    assert rx[1:] == ry[1:]


def test_a_failed_registration_warns_instead_of_failing_the_import():
    from extrapos.auto_registration import run_safely

    def broken():
        raise AttributeError("AutoConfig has no attribute register")

    with pytest.warns(UserWarning, match="trust_remote_code=True"):
        run_safely(broken)


def test_a_windowed_layers_cache_in_transformers_keeps_only_what_its_window_reaches(tmp_path):
    """``generate``'s cache (ExtraposCache) drops the keys a sliding window can no longer see, as the
    library's decoding does: the full layer keeps every key, the windowed one O(W), the logits unchanged."""
    window = 6
    out = _export(tmp_path, sliding_window=window, sliding_window_layers=[1])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    torch.manual_seed(3)
    tokens = torch.randint(0, VOCAB, (1, L))
    with torch.no_grad():
        ref = hf(tokens).logits
    name = hf_cache_name(hf)
    with torch.no_grad():
        past = getattr(hf(tokens[:, :4], use_cache=True), name)
        for s in range(4, L):
            step = hf(tokens[:, s : s + 1], use_cache=True, **{name: past})
            assert (step.logits[0, -1] - ref[0, s]).abs().max() < TOL
            past = getattr(step, name)
    full, windowed = past.cache.layers
    assert past.get_seq_length() == L and full.k.n == L
    assert windowed.k.n < window - 1 + 16 and windowed.k.buf.shape[2] <= 2 * (window - 1) + 16 < L
