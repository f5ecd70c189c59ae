"""The CPU presets of issue 39: quick-precision pairs each bf16 row with an fp32 twin that is the quick-seeds
run itself, and medium trains cpu/medium's model on long code documents in the precision auto picks."""

from __future__ import annotations

from dataclasses import replace

import torch

from extrapos.compare import load_sweep, row_config
from extrapos.run import precision


def test_quick_precision_fp32_rows_are_the_quick_seeds_runs_and_bf16_rows_differ_only_in_precision():
    seeded, paired = load_sweep("quick-seeds"), load_sweep("quick-precision")
    assert paired.seeds == seeded.seeds == [0, 1, 2] and paired.eval_precision == "fp32"
    assert (paired.set, paired.lengths, paired.max_eval_tokens) == (
        seeded.set,
        seeded.lengths,
        seeded.max_eval_tokens,
    )
    by_encoding = {row.positions["name"]: row for row in seeded.rows}
    names = []
    for row in paired.rows:
        encoding, prec = row.positions["name"], row.name.split()[-1]
        names.append((encoding, prec))
        for seed in paired.seeds:
            seed_set = [f"train.seed={seed}"]
            mine = row_config(paired, row, seed_set)
            theirs = row_config(seeded, by_encoding[encoding], seed_set)
            assert mine.train.precision == prec
            # a directory holding the quick-seeds run as <slug>-seed<s> is reused only when the configs match
            assert mine.to_toml() == replace(theirs, train=replace(theirs.train, precision=prec)).to_toml()
            if prec == "fp32":
                assert mine.to_toml() == theirs.to_toml()
    assert names == [(e, p) for e in ("rope", "cable", "expe") for p in ("fp32", "bf16")]


def test_medium_trains_the_cpu_medium_model_packed_with_document_masks_in_autos_precision(monkeypatch):
    sweep = load_sweep("medium")
    assert [r.positions["name"] for r in sweep.rows if not r.reuse] == [
        "nope",
        "rope",
        "alibi",
        "cable",
        "expe",
    ]
    assert [(r.name, r.reuse, r.eval) for r in sweep.rows if r.reuse] == [
        ("ExPE x0.5", "ExPE", {"scale": 0.5})
    ]
    assert (sweep.protocol, sweep.boundary, sweep.eval_precision) == ("stream", "mask", "fp32")
    for row in sweep.rows:
        if row.reuse:
            continue
        cfg = row_config(sweep, row, [])
        m, d, t = cfg.model, cfg.data, cfg.train
        assert (m.n_layers, m.d_model, m.n_heads, m.vocab_size, m.train_length) == (6, 256, 4, 50257, 256)
        assert (d.corpus, d.tokenizer, d.packed, d.document_mask, d.document_positions) == (
            "python-stdlib",
            "gpt2",
            True,
            True,
            "restart",
        )
        assert t.precision == "auto" and t.compile
    # auto's choice for this width: bf16 where the CPU multiplies bf16 natively, fp32 where it emulates it
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: {"amx": False, "avx512_bf16": True})
    assert precision.auto_precision(cpu, 256)[0] == "bf16"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert precision.auto_precision(cpu, 256)[0] == "fp32"


def test_a_report_names_each_rows_training_precision_as_it_trained(tmp_path, tiny_data):
    """Rows trained in different precisions are named with theirs (the report once printed the first row's
    for all), ``auto`` is reported as what it resolved to in the run, and a finished auto run is reused
    (its config.toml holds the resolved precision; the sweep once refused it as a different config)."""
    import json

    from extrapos.compare import compare
    from tests.conftest import tiny_overrides

    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 2})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "precisions"\ntrain = "cpu/tiny"\nlengths = [1, 2]\nmax_eval_tokens = 64\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "A"\npositions = { name = "rope" }\nset = [\'train.precision="fp32"\']\n'
        '[[rows]]\nname = "B"\npositions = { name = "rope" }\nset = [\'train.precision="bf16"\']\n'
        '[[rows]]\nname = "C"\npositions = { name = "rope" }\nset = [\'train.precision="auto"\']\n'
    )
    text = compare(str(f), tmp_path / "out", progress=False).read_text()
    # C is 32 wide, so auto trains it in fp32 on any CPU
    assert "fp32 (A, C) / bf16 (B)," in text
    # run again into the same folder: C's saved config says fp32 where the row says auto, and it is reused
    again = compare(str(f), tmp_path / "out", progress=False).read_text()
    assert "fp32 (A, C) / bf16 (B)," in again


def test_medium_seeds_seed_zero_is_the_medium_sweeps_run():
    medium, seeded = load_sweep("medium"), load_sweep("medium-seeds")
    assert seeded.seeds == [0, 1, 2] and seeded.baseline == "RoPE"
    assert (
        seeded.lengths,
        seeded.max_eval_tokens,
        seeded.protocol,
        seeded.boundary,
        seeded.eval_precision,
    ) == (
        medium.lengths,
        medium.max_eval_tokens,
        medium.protocol,
        medium.boundary,
        medium.eval_precision,
    )
    rows = {r.name: r for r in medium.rows}
    for row in seeded.rows:
        if row.reuse:
            assert (row.reuse, row.eval) == (rows[row.name].reuse, rows[row.name].eval)
            continue
        seed_zero = row_config(seeded, row, ["train.seed=0"]).to_toml()
        assert seed_zero == row_config(medium, rows[row.name], []).to_toml()
