"""Every number says what it depends on, and every reader checks it (issue 24, items 7-11): the data's
tokenizer against the run's, an imported run's tokenizer wherever the run is moved, the parent's weights
before an extension, the objective, tokenizer and finiteness of each report row, and the checkpoint step a
row scored.

Each refusal: exit status 2, one sentence, no traceback, every file that existed keeps its bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
from harness import assert_user_error, run

from tests.conftest import tiny_overrides
from tests.integrations.hf_helpers import write_tokenizer

EVAL = ["--lengths", "1", "--max-tokens", "64", "--no-progress"]


def _train(out, data_dir, **extra):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    train(load_config("cpu/tiny", tiny_overrides(data_dir, **extra)), out, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """Two 8-step runs of one config and different seeds (the same weight shapes): ``main`` with
    checkpoints at steps 4 and 8, ``other`` with its final one only."""
    root = tmp_path_factory.mktemp("records")
    return {
        "main": _train(root / "main", tiny_data, **{"train.checkpoint_every": 4}),
        "other": _train(root / "other", tiny_data, **{"train.seed": 7}),
    }


@pytest.fixture(scope="module")
def other_tokenizer_data(tmp_path_factory):
    """A prepared data directory of another tokenizer (a 300-token BPE) with the same kind of text."""
    from extrapos.data import prepare_data

    corpus = tmp_path_factory.mktemp("corpus")
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(
            f"Address {i}. " + "The state of the union is strong. " * (40 + i)
        )
    out = tmp_path_factory.mktemp("data") / "other-tok"
    return prepare_data(str(corpus), "bpe:300", out, split_fractions=(0.5, 0.25, 0.25), progress=False)


@pytest.fixture
def run_copy(runs, scratch):
    out = scratch / "run"
    shutil.copytree(runs["main"], out)
    return out


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- 7. data of another tokenizer ---------------------------------------------------------------------


def test_eval_refuses_data_of_another_tokenizer(run_copy, other_tokenizer_data, cache):
    assert_user_error(
        ["eval", str(run_copy), "--data", str(other_tokenizer_data), *EVAL],
        cache=cache,
        watch=[run_copy, other_tokenizer_data],
        fragments=[str(other_tokenizer_data), "another tokenizer", "--data"],
    )
    assert not (run_copy / "eval").exists() or not list((run_copy / "eval").glob("*.json"))


def test_eval_refuses_when_the_runs_data_was_replaced(run_copy, other_tokenizer_data, cache):
    """data.json names the data the run trained on; prepared again with another tokenizer, it is refused."""
    (run_copy / "data.json").write_text(json.dumps({"dir": str(other_tokenizer_data)}))
    assert_user_error(
        ["eval", str(run_copy), *EVAL],
        cache=cache,
        watch=[run_copy, other_tokenizer_data],
        fragments=["another tokenizer", "tokenizer.json"],
    )


def test_eval_accepts_data_of_the_runs_own_tokenizer(run_copy, tiny_data, cache):
    result = run(["eval", str(run_copy), "--data", str(tiny_data), "--name", "own", *EVAL], cache=cache)
    assert result.returncode == 0, result.stderr
    saved = json.loads((run_copy / "eval" / "own.json").read_text())
    from extrapos.data import load_tokenizer

    assert saved["tokenizer_hash"] == load_tokenizer(run_copy).hash and math.isfinite(
        saved["results"][0]["loss"]
    )


# ---- 8. an imported run keeps its own tokenizer wherever it is moved -----------------------------------


def _llama(path, vocab):
    """A one-layer Llama directory written by hand (as test_import_inputs) with a ``vocab``-token BPE."""
    import torch
    from safetensors.torch import save_file

    D, H, V = 16, 24, 320
    config = {
        "model_type": "llama",
        "hidden_size": D,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": H,
        "vocab_size": V,
        "max_position_embeddings": 32,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    }
    g = torch.Generator().manual_seed(vocab)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    layer = "model.layers.0"
    tensors = {
        "model.embed_tokens.weight": w(V, D),
        **{f"{layer}.self_attn.{p}_proj.weight": w(D, D) for p in "qkvo"},
        f"{layer}.mlp.gate_proj.weight": w(H, D),
        f"{layer}.mlp.up_proj.weight": w(H, D),
        f"{layer}.mlp.down_proj.weight": w(D, H),
        f"{layer}.input_layernorm.weight": torch.ones(D),
        f"{layer}.post_attention_layernorm.weight": torch.ones(D),
        "model.norm.weight": torch.ones(D),
    }
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(path, vocab)
    return path


def test_a_moved_import_keeps_its_own_tokenizer(scratch, corpus, cache):
    """Import to A, move A to B, import another model (another tokenizer) to A: B is evaluated with its own
    tokenizer, on data tokenized by it (it used to read A's new tokenizer through an absolute path)."""
    from extrapos.cli import main
    from extrapos.data import load_tokenizer
    from extrapos.run.config import load_run_config

    a, b = scratch / "A", scratch / "B"
    assert main(["import", str(_llama(scratch / "m1", 300)), "--out", str(a), "--corpus", str(corpus)]) == 0
    assert load_run_config(a).data.tokenizer == "tokenizer.json"  # relative to the run, never absolute
    a.rename(b)
    assert main(["import", str(_llama(scratch / "m2", 280)), "--out", str(a), "--corpus", str(corpus)]) == 0
    mine, theirs = load_tokenizer(b).hash, load_tokenizer(a).hash
    assert mine != theirs

    result = run(["eval", str(b), "--name", "moved", *EVAL], cache=cache)
    assert result.returncode == 0, result.stderr
    saved = json.loads((b / "eval" / "moved.json").read_text())
    manifest = json.loads((Path(saved["data_dir"]) / "manifest.json").read_text())
    assert saved["tokenizer_hash"] == mine and manifest["tokenizer"]["hash"] == mine

    # read from its config without the run (train --resume of an import), the name is refused, not looked
    # up in the current directory
    assert_user_error(
        ["train", "--resume", "--out", str(b), "--set", "train.steps=2", "--no-progress"],
        cache=cache,
        watch=[b, a],
        fragments=["data.tokenizer 'tokenizer.json'", "relative to the run"],
    )

    # an import of an older extrapos recorded A's absolute path: B still reads its own tokenizer
    config = (b / "config.toml").read_text()
    (b / "config.toml").write_text(config.replace('"tokenizer.json"', json.dumps(str(a / "tokenizer.json"))))
    assert str(a / "tokenizer.json") in (b / "config.toml").read_text()
    result = run(["eval", str(b), "--name", "old", *EVAL], cache=cache)
    assert result.returncode == 0, result.stderr
    old = json.loads((b / "eval" / "old.json").read_text())
    assert old["data_dir"] == saved["data_dir"] and old["results"][0]["loss"] == saved["results"][0]["loss"]


# ---- 9. extend verifies the parent's weights -----------------------------------------------------------


def _swap_weights(run_dir, donor, steps):
    """Copy ``donor``'s final weights over ``run_dir``'s checkpoints at ``steps`` (the same size, another
    sha256: what eval and generate already refuse)."""
    final = max((p for p in (donor / "checkpoints").iterdir()), key=lambda p: int(p.name.split("-")[1]))
    for step in steps:
        target = run_dir / "checkpoints" / f"step-{step}" / "model.safetensors"
        assert target.stat().st_size == (final / "model.safetensors").stat().st_size
        shutil.copyfile(final / "model.safetensors", target)


def test_extend_refuses_weights_copied_from_another_run(run_copy, runs, scratch, cache):
    _swap_weights(run_copy, runs["other"], [4, 8])
    ext = scratch / "ext"
    assert_user_error(
        ["extend", str(run_copy), "--method", "chunk", "--tokens", "256", "--out", str(ext), "--no-progress"],
        cache=cache,
        watch=[run_copy],
        fragments=["every checkpoint", "damaged"],
    )
    assert not ext.exists()  # nothing left behind: a retry is not "already holds a run"


def test_extend_skips_a_newest_checkpoint_with_foreign_weights(run_copy, runs, scratch, cache):
    """As eval does: the newest intact checkpoint is used, the damaged one named; parent.json records the
    step and the sha256 of the weights it started from."""
    _swap_weights(run_copy, runs["other"], [8])
    ext = scratch / "ext"
    result = run(
        ["extend", str(run_copy), "--method", "chunk", "--tokens", "256", "--out", str(ext), "--no-progress"],
        cache=cache,
    )
    assert result.returncode == 0, result.stderr
    assert "step-8 is damaged (model.safetensors does not match its recorded sha256)" in result.stdout
    record = json.loads((ext / "parent.json").read_text())
    assert record["step"] == 4
    assert record["weights_sha256"] == _sha256(run_copy / "checkpoints" / "step-4" / "model.safetensors")


# ---- 10. report: objectives, tokenizers and NaN rows ---------------------------------------------------


@pytest.fixture(scope="module")
def scored(runs, tmp_path_factory):
    """One real next-token result of the main run (library call)."""
    from extrapos.evaluate import EvalRequest, evaluate

    copy = tmp_path_factory.mktemp("scored") / "run"
    shutil.copytree(runs["main"], copy)
    return evaluate(copy, EvalRequest(lengths=[1, 2], max_tokens=128), name="lm", progress=False)


def _variant(result, folder, name, **changes):
    doc = json.loads(json.dumps(result))
    doc.update(changes, name=name)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _sections(report: str) -> dict[str, str]:
    """The report's '## ' sections by heading."""
    return {part.split("\n", 1)[0]: part for part in report.split("\n## ")[1:]}


def test_report_never_puts_mlm_and_next_token_rows_in_one_table(scored, scratch, cache):
    mlm = dict(scored, objective="mlm")
    files = [_variant(scored, scratch, "nexttoken"), _variant(mlm, scratch, "masked")]
    out = scratch / "report"
    result = run(["report", *map(str, files), "--out", str(out)], cache=cache)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "2 kinds of loss that cannot be compared" in text
    assert "a masked-token loss is not a next-token loss)" in text and "tokenizers" not in text
    assert (out / "plots" / "masked-token-mlm-loss" / "loss_vs_length.png").is_file()
    sections = _sections(text)
    assert set(sections) == {"Next-token loss", "Masked-token (MLM) loss"}
    assert "| nexttoken |" in sections["Next-token loss"] and "| masked |" not in sections["Next-token loss"]
    masked = sections["Masked-token (MLM) loss"]
    assert "| masked |" in masked and "| nexttoken |" not in masked and "Mean masked-token loss" in masked
    # the table printed on stdout separates them too
    assert "2 kinds of loss that cannot be compared" in result.stdout


def test_report_never_compares_two_tokenizers(scored, scratch, cache):
    files = [
        _variant(scored, scratch, "ours"),
        _variant(scored, scratch, "theirs", tokenizer_hash="0123456789abcdef"),
    ]
    out = scratch / "report"
    result = run(["report", *map(str, files), "--out", str(out)], cache=cache)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "losses under different tokenizers are per different tokens)" in text
    sections = _sections(text)
    assert set(sections) == {f"Tokenizer {scored['tokenizer_hash']}", "Tokenizer 0123456789abcdef"}
    for heading, section in sections.items():
        mine, other = ("ours", "theirs") if scored["tokenizer_hash"] in heading else ("theirs", "ours")
        assert f"| {mine} |" in section and f"| {other} |" not in section
        assert f"Difference to the baseline row ({mine})" in section


def test_report_flags_nan_rows_and_never_marks_them_best(scored, scratch, cache):
    broken = json.loads(json.dumps(scored))
    for r in broken["results"]:
        r["loss"], r["ppl"] = math.nan, math.nan
    files = [_variant(scored, scratch, "fine"), _variant(broken, scratch, "diverged")]
    out = scratch / "report"
    result = run(["report", *map(str, files), "--out", str(out)], cache=cache)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "Not finite: diverged scored a NaN or infinite loss" in text
    table = text.split("Mean token loss")[1].split("Difference to the baseline")[0]
    diverged = next(line for line in table.splitlines() if line.startswith("| diverged |"))
    fine = next(line for line in table.splitlines() if line.startswith("| fine |"))
    assert diverged.count("NaN (not finite)") == 2 and "**" not in diverged
    assert fine.count("**") == 4  # the finite row is the best of both columns
    differences = text.split("Difference to the baseline row (fine)")[1].split("Perplexity")[0]
    assert next(line for line in differences.splitlines() if line.startswith("| diverged |")).count("–") == 2


# ---- 11. the report names the checkpoint step a row scored ----------------------------------------------


def test_report_names_the_step_and_warns_of_a_newer_checkpoint(run_copy, cache):
    result = run(["eval", str(run_copy), "--step", "4", "--name", "early", *EVAL], cache=cache)
    assert result.returncode == 0, result.stderr
    out = run_copy.parent / "report"
    result = run(["report", str(run_copy), "--out", str(out)], cache=cache)
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "Checkpoint scored: step 4 for every row." in text
    assert "Warning: run/early scored step 4 but its run" in text and "newer checkpoint (step 8)" in text
    assert "extrapos: warning: run/early scored step 4" in result.stderr
    with open(out / "results.csv") as f:
        assert {line.split(",")[-1].strip() for line in f.readlines()[1:]} == {"4"}
