"""Rows that name an existing run (an `extrapos import` output) in compare: evaluated, reused with a RoPE
scaling and extended with chunk like trained rows, with a report that re-renders byte for byte."""

from __future__ import annotations

import json
import random

import pytest

from extrapos.cli import main
from extrapos.compare import compare, load_sweep
from extrapos.errors import UserError
from tests.integrations.hf_helpers import CONTEXT, TEXT, save_hf

pytest.importorskip("transformers")


def _corpus(directory):
    """Forty documents of the tokenizer's own sentences, long enough for windows of 2 x CONTEXT."""
    rng = random.Random(0)
    directory.mkdir()
    sentences = [s for t in TEXT for s in t.split(". ") if s.strip()]
    for i in range(40):
        (directory / f"doc{i:02d}.txt").write_text(". ".join(rng.choice(sentences) for _ in range(60)))
    return directory


def _sweep(path, run: str, extra: str = "") -> str:
    path.write_text(
        'title = "imported"\nlengths = [1, 2]\neval_each_length = true\nmax_eval_tokens = 256\n'
        f"extend_tokens = 2048\n{extra}"
        f'[[rows]]\nname = "Llama"\nrun = "{run}"\n'
        '[[rows]]\nname = "Llama linear"\nreuse = "Llama"\neval = { scaling = "linear", factor = 2.0 }\n'
        '[[rows]]\nname = "Llama chunk-0.25"\nset = ["train.batch_size=4"]\n'
        'extend = { from = "Llama", method = "chunk", alpha = 0.25, factor = [2] }\n'
    )
    return str(path)


def _snapshot(out):
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "runs" not in p.relative_to(out).parts
    }


def test_an_imported_run_is_evaluated_reused_and_extended(tmp_path, monkeypatch):
    from extrapos.integrations.hf import import_pretrained

    save_hf("llama", tmp_path / "hf")
    import_pretrained(
        tmp_path / "hf",
        tmp_path / "imported",
        data={"corpus": str(_corpus(tmp_path / "corpus")), "split_fractions": [0.5, 0.25, 0.25]},
    )
    monkeypatch.chdir(tmp_path)  # run = "imported" is taken from the current directory
    out = tmp_path / "out"
    report = compare(_sweep(tmp_path / "sweep.toml", "imported"), out, progress=False)

    text = report.read_text()
    for name in ("Llama", "Llama linear", "Llama chunk-0.25"):
        assert f"| {name} |" in text
    assert (
        f"Llama: existing run imported (llama, 2 layers, d=64, 4 heads, encoding rope, L_t={CONTEXT}; "
        "imported "
        f"from {tmp_path / 'hf'}" in text
    )
    assert "extension: 1 runs" in text and "model: " not in text  # no trained row: no training facts
    entries = json.loads((out / "rows.json").read_text())
    assert entries[0]["run"] == [str((tmp_path / "imported").resolve())] * 2  # one evaluation per length
    assert entries[2]["run"] == ["runs/llama-chunk-0-25-x2"]
    parent = json.loads((out / "runs" / "llama-chunk-0-25-x2" / "parent.json").read_text())
    assert (
        parent["parent"] == str((tmp_path / "imported").resolve())
        and parent["extended_length"] == 2 * CONTEXT
    )
    results = json.loads((out / "results.json").read_text())
    assert [[r["ev"] for r in row["results"]] for row in results] == [[1, 2], [1, 2], [2]]
    assert results[1]["applied"] == {"scaling": "linear", "factor": 2.0} and results[0]["applied"] == {}
    assert (
        results[0]["results"][1]["loss"] != results[1]["results"][1]["loss"]
    )  # the scaling changed the model
    # the imported run got evaluation results and nothing else: no training happened in it
    assert not (tmp_path / "imported" / "summary.json").exists()
    assert (tmp_path / "imported" / "eval").is_dir()

    before = _snapshot(out)
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert _snapshot(out) == before


def test_imported_rows_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"extrapos import SOURCE --out missing"):
        compare(_sweep(tmp_path / "a.toml", "missing"), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    with pytest.raises(UserError, match="one run, not one per seed"):
        load_sweep(_sweep(tmp_path / "b.toml", "x", "seeds = [0, 1]\n"))
    bad = tmp_path / "c.toml"
    bad.write_text('[[rows]]\nname = "A"\nrun = "x"\npositions = { name = "rope" }\n')
    with pytest.raises(UserError, match="takes no positions, set, reuse or extend"):
        load_sweep(str(bad))


def test_pretrained_extension_presets_name_imported_runs():
    for name in ("pretrained-extension", "paper/pretrained-extension"):
        sweep = load_sweep(name)
        imported = [r for r in sweep.rows if r.run]
        assert len(imported) == 3 and sweep.eval_each_length and sweep.lengths == [2, 4]
        chunk = [r for r in sweep.rows if r.extend is not None and r.extend.method == "chunk"]
        assert {r.extend.parent for r in chunk} == {r.name for r in imported}
        assert all(r.extend.alpha == 0.25 and r.factors == [2, 4] for r in chunk)
        for r in imported:
            assert f"--out {r.run}" in sweep.notes  # the notes say how to create every run the preset names


@pytest.mark.slow  # three imports, six extension runs and their evaluations: about a minute
def test_the_cpu_twin_runs_on_tiny_random_models(tmp_path, monkeypatch):
    """The shipped CPU twin's rows (GPT-2 with its table interpolated, GPT-NeoX, Bloom; full and chunk-0.25 to
    2x and 4x), on tiny random models of the same architectures instead of the hub's, with tiny budgets."""
    from extrapos.integrations.hf import import_pretrained
    from extrapos.presets import find_sweep

    corpus = _corpus(tmp_path / "corpus")
    for kind, run in (
        ("gpt_neox", "runs/hf-pythia-14m"),
        ("gpt2", "runs/hf-tiny-gpt2"),
        ("bloom", "runs/hf-tiny-bloom"),
    ):
        save_hf(kind, tmp_path / f"hf-{kind}")
        import_pretrained(
            tmp_path / f"hf-{kind}",
            tmp_path / run,
            data={"corpus": str(corpus), "split_fractions": [0.5, 0.25, 0.25]},
        )
    text = find_sweep("pretrained-extension").read_text()
    text = text.replace("extend_tokens = 65_536", "extend_tokens = 1024").replace(
        "max_eval_tokens = 16_384", "max_eval_tokens = 256"
    )
    (tmp_path / "twin.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    report = compare(str(tmp_path / "twin.toml"), out, progress=False)
    results = {r["name"]: r for r in json.loads((out / "results.json").read_text())}
    assert len(results) == 9 and all([x["ev"] for x in r["results"]] == [2, 4] for r in results.values())
    assert results["tiny GPT-2 OOTB"]["applied"] == {
        "interpolate_to": "max"
    }  # its table of CONTEXT rows, stretched
    assert {r["encoding"] for r in results.values()} == {"learned", "rope", "alibi"}
    before = _snapshot(out)
    report.unlink()
    assert main(["report", str(out)]) == 0
    assert _snapshot(out) == before
