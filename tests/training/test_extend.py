"""`extrapos extend`: equal budgets, the learned-table interpolation, parent.json, resume, and compare
rows."""

from __future__ import annotations

import json

import pytest
import torch

import extrapos.run.checkpoint as ckpt_io
from extrapos.errors import UserError
from extrapos.run.config import load_config
from extrapos.run.directory import load_run
from extrapos.training.extend import METHODS, extend, extension_config
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

L_T = 16


@pytest.fixture(scope="module")
def parents(tiny_data, tmp_path_factory):
    """Two finished tiny runs at L_t = 16: a learned table and RoPE."""
    root = tmp_path_factory.mktemp("parents")
    runs = {}
    for name in ("learned", "rope"):
        cfg = load_config(
            "cpu/tiny",
            tiny_overrides(
                tiny_data, **{"model.train_length": L_T, "train.steps": 3, "model.positions.name": name}
            ),
        )
        train(cfg, root / name, progress=False)
        runs[name] = root / name
    return runs


def test_every_method_gets_the_same_tokens_and_steps(parents):
    seen = {}
    for method in METHODS:
        cfg, record = extension_config(parents["rope"], method, factor=4, tokens=1000)
        steps = cfg.train.tokens // (cfg.train.batch_size * cfg.seq_len)
        seen[method] = (cfg.train.tokens, steps)
        assert record["method"] == method and record["factor"] == 4 and record["train_length"] == L_T
        assert record["extended_length"] == 64 and cfg.data.extended_length == 64
        assert cfg.model.train_length == L_T  # ExPE's theta and FIRE's L stay the parent's
        # continues near the parent's final lr (cpu/tiny: 3e-3 -> 3e-4): max(end_lr, 0.1 x lr), then to end_lr
        assert cfg.train.warmup == 0.05 and cfg.train.lr == pytest.approx(3e-4) and cfg.train.end_lr == 3e-4
        if method == "full":
            assert cfg.seq_len == 64 and cfg.train.batch_size == 1 and cfg.data.sampler == "full"
        else:
            assert cfg.seq_len == L_T and cfg.train.batch_size == 4
        assert cfg.data.sampler == ("contiguous" if method == "continue" else method)
    assert len(set(seen.values())) == 1 and seen["chunk"] == (960, 15)  # 1000 rounded down to whole steps
    # the default budget is the paper's: L_e / L_t epochs of the L_e windows = windows x L_e tokens
    from extrapos.data import open_split
    from extrapos.data.segmented import compute_equivalent_tokens

    split = open_split(json.loads((parents["rope"] / "data.json").read_text())["dir"], "train")
    full, _ = extension_config(parents["rope"], "full", factor=2)
    chunk, record = extension_config(parents["rope"], "chunk", factor=2, alpha=0.5)
    assert full.train.tokens == chunk.train.tokens == compute_equivalent_tokens(split, L_T, 32) // 64 * 64
    assert record["compute_equivalent"] and record["alpha"] == 0.5
    # --set train.tokens=N is the same override as --tokens
    a, _ = extension_config(parents["rope"], "prefix", 2, 0.5, overrides=["train.tokens=640"])
    assert a.train.tokens == 640


def test_a_packed_document_masked_parent_extends_with_every_method(tiny_data, tmp_path):
    """cpu/medium packs with a document mask and restarted positions: the methods that draw each example from
    one document turn both off (an unpacked config refuses them, and extending such a parent failed with
    that refusal); ``continue`` keeps the parent's packed, masked windows. A chunk child trains."""
    packed = {"data.packed": "true", "data.document_mask": "true", "data.document_positions": '"restart"'}
    cfg = load_config(
        "cpu/tiny", tiny_overrides(tiny_data, **{"model.train_length": L_T, "train.steps": 2, **packed})
    )
    parent = tmp_path / "parent"
    train(cfg, parent, progress=False)
    for method in METHODS:
        child, _ = extension_config(parent, method, factor=2, tokens=256)
        d = child.data
        if method == "continue":
            assert (d.packed, d.document_mask, d.document_positions) == (True, True, "restart")
        else:
            assert (d.packed, d.document_mask, d.document_positions) == (False, False, "continue"), method
    extend(parent, "chunk", factor=2, alpha=0.25, tokens=256, out=tmp_path / "chunk", progress=False)
    assert (tmp_path / "chunk" / "summary.json").exists()


def test_learned_table_is_interpolated_and_the_rest_loaded(parents, tmp_path):
    out = tmp_path / "ext"
    # learning rate 0: the extension run's weights stay its initial weights
    extend(
        parents["learned"],
        "chunk",
        factor=2,
        alpha=0.5,
        out=out,
        tokens=128,
        progress=False,
        overrides=["train.lr=0", "train.end_lr=0"],
    )
    parent, child = load_run(parents["learned"]), load_run(out)
    assert child.cfg.model.positions["max_length"] == 32 and child.cfg.model.train_length == L_T
    old, new = parent.model.pos.table.detach(), child.model.pos.table.detach()
    assert new.shape == (32, old.shape[1])
    # segmented sequences §3.2 with beta = 2: e'_2i = e_i, e'_2i+1 = (e_i + e_i+1) / 2, the last rows =
    # e_{L_t-1}
    torch.testing.assert_close(new[0:31:2], old)
    torch.testing.assert_close(new[1:30:2], (old[:-1] + old[1:]) / 2)
    torch.testing.assert_close(new[31], old[-1])
    p_state, c_state = parent.model.state_dict(), child.model.state_dict()
    for k in p_state:
        if k != "pos.table":
            torch.testing.assert_close(c_state[k], p_state[k])
    record = json.loads((out / "parent.json").read_text())
    assert record["parent"] == str(parents["learned"].resolve()) and record["step"] == 3
    assert record["method"] == "chunk" and record["alpha"] == 0.5 and record["factor"] == 2
    assert record["train_length"] == L_T and record["extended_length"] == 32
    assert any("learned table interpolated 16 -> 32" in c for c in record["changes"])
    # the OOTB baseline is one evaluation away: the parent read through an interpolated table
    from extrapos.evaluate import EvalRequest, evaluate

    res = evaluate(
        parents["learned"],
        EvalRequest(lengths=[2], position_options={"interpolate_to": "max"}, max_tokens=64),
        progress=False,
    )
    assert res["encoding_options"]["interpolate_to"] == 32 and res["results"][0]["window"] == 32


def test_extend_resumes_after_an_interruption_exactly(parents, tmp_path, monkeypatch):
    sets = ["train.checkpoint_every=2", "train.keep_checkpoints=0"]
    straight = tmp_path / "straight"
    extend(
        parents["learned"],
        "prefix",
        factor=2,
        alpha=0.5,
        out=straight,
        tokens=384,
        overrides=sets,
        progress=False,
    )
    cut = tmp_path / "cut"
    original = ckpt_io.save_checkpoint

    def killed(run_dir, step, *a, **kw):
        path = original(run_dir, step, *a, **kw)
        if step == 2:
            raise KeyboardInterrupt  # killed right after the step-2 checkpoint
        return path

    monkeypatch.setattr(ckpt_io, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        extend(
            parents["learned"],
            "prefix",
            factor=2,
            alpha=0.5,
            out=cut,
            tokens=384,
            overrides=sets,
            progress=False,
        )
    monkeypatch.setattr(ckpt_io, "save_checkpoint", original)
    with pytest.raises(UserError, match="--resume"):
        extend(
            parents["learned"],
            "prefix",
            factor=2,
            alpha=0.5,
            out=cut,
            tokens=384,
            overrides=sets,
            progress=False,
        )
    with pytest.raises(UserError, match="not this extension"):
        extend(
            parents["learned"],
            "chunk",
            factor=2,
            alpha=0.5,
            out=cut,
            tokens=384,
            overrides=sets,
            resume=True,
            progress=False,
        )
    result = extend(
        parents["learned"],
        "prefix",
        factor=2,
        alpha=0.5,
        out=cut,
        tokens=384,
        overrides=sets,
        resume=True,
        progress=False,
    )
    assert result.steps == 6
    a, b = load_run(straight).model.state_dict(), load_run(cut).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (cut / "metrics.jsonl").read_text().count('"loss"') == (
        straight / "metrics.jsonl"
    ).read_text().count('"loss"')


def test_cli_and_errors(parents, tmp_path, capsys):
    from extrapos.cli import main

    out = tmp_path / "rope-randompos"
    args = [
        "extend",
        str(parents["rope"]),
        "--method",
        "randompos",
        "--factor",
        "2",
        "--tokens",
        "128",
        "--rope-interpolation",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    # --no-progress keeps the plan and its time estimate, on stdout with train's own lines (stderr is for
    # the one sentence of an error)
    printed = capsys.readouterr()
    assert "extrapos extend: randompos x2" in printed.out and "estimated time:" in printed.out
    assert "extrapos extend:" not in printed.err and "done:" in printed.out
    cfg = load_run(out).cfg
    assert cfg.model.positions["scaling"] == "linear" and cfg.model.positions["factor"] == 2.0
    assert (
        cfg.data.sampler == "randompos"
        and json.loads((out / "parent.json").read_text())["rope_interpolation"]
    )
    assert main(args) == 2  # exists: needs --resume
    assert main(args + ["--resume"]) == 0  # finished: nothing to do
    with pytest.raises(UserError, match="RoPE models"):
        extension_config(parents["learned"], "chunk", rope_interpolation=True)
    with pytest.raises(UserError, match="alpha applies"):
        extension_config(parents["rope"], "full", alpha=0.5)
    with pytest.raises(UserError, match="whole number"):
        extension_config(parents["rope"], "chunk", alpha=0.3)
    with pytest.raises(UserError, match="unknown extension method"):
        extension_config(parents["rope"], "stretch")


def test_compare_extension_rows(parents, tiny_data, tmp_path):
    from extrapos.compare import compare, load_sweep

    sets = tiny_overrides(tiny_data, **{"model.train_length": L_T, "train.steps": 2})
    spec = tmp_path / "ext.toml"
    spec.write_text(
        'title = "tiny extension"\ntrain = "cpu/tiny"\nlengths = [2, 4]\nmax_eval_tokens = 128\n'
        f"eval_each_length = true\nextend_tokens = 128\nset = {json.dumps(sets)}\n"
        '[[rows]]\nname = "APE OOTB"\npositions = { name = "learned" }\neval = { interpolate_to = "max" }\n'
        '[[rows]]\nname = "APE chunk-0.5"\nextend = { from = "APE OOTB", method = "chunk", alpha = 0.5, '
        "factor = [2, 4] }\n"
        '[[rows]]\nname = "APE full"\nextend = { from = "APE OOTB", method = "full", factor = 2 }\n'
    )
    sweep = load_sweep(str(spec))
    assert sweep.rows[1].positions == {"name": "learned"} and sweep.rows[1].factors == [2, 4]
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    rows = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in rows] == ["APE OOTB", "APE chunk-0.5", "APE full"]
    assert [r["ev"] for r in rows[0]["results"]] == [2, 4] and [r["ev"] for r in rows[2]["results"]] == [2]
    assert [r["window"] for r in rows[1]["results"]] == [32, 64]
    assert rows[0]["parts"][1]["ev"] == [4]
    # each column scores the same held-out tokens for every row
    assert (
        rows[0]["results"][0]["tokens"] == rows[1]["results"][0]["tokens"] == rows[2]["results"][0]["tokens"]
    )
    assert (
        json.loads((out / "runs" / "ape-chunk-0-5-x4" / "parent.json").read_text())["extended_length"] == 64
    )
    report = (out / "report.md").read_text()
    assert "| APE chunk-0.5 |" in report and "extension: 3 runs" in report
    compare(str(spec), out, progress=False)  # finished runs are reused
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[rows]]\nname = "A"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "B"\nextend = { from = "nope", method = "chunk" }\n'
    )
    with pytest.raises(UserError, match="needs extend"):
        load_sweep(str(bad))


def test_chunk_without_alpha_uses_the_default_and_a_missing_run_is_one_sentence(tmp_path, capsys):
    from extrapos.cli import main
    from extrapos.training.extend import default_out

    assert default_out(tmp_path / "run", "chunk", 2).name == "run-chunk-0.25-x2"
    assert main(["extend", str(tmp_path / "missing"), "--method", "chunk"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_pose_chunks_carry_to_a_pose_extension_only():
    from dataclasses import replace

    from extrapos.run.config import DataConfig
    from extrapos.training.extend import extended_data

    parent = replace(DataConfig(), sampler="pose", extended_length=64, pose_chunks=4)
    assert extended_data(parent, "pose", None, 128)[0].pose_chunks == 4
    for method in ("chunk", "randompos", "full", "continue"):
        assert extended_data(parent, method, 0.25, 128)[0].pose_chunks == 2  # valid for their samplers


def test_the_plans_measurement_leaves_the_run_rng_as_it_was():
    """The plan's timed pass draws random weights and tokens from a fork of the generator: the run is seeded
    before its plan is said, and an extension started over says none, so a draw from the run's own generator
    made the RNG state its checkpoints save differ between the two (issue 48)."""
    from extrapos.training.extension_plan import seconds_per_micro_batch

    cfg = load_config("cpu/tiny", ['train.device="cpu"', "model.train_length=16", "train.batch_size=2"])
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    seconds, device = seconds_per_micro_batch(cfg)
    assert seconds > 0 and device == "cpu"
    assert torch.equal(torch.get_rng_state(), before)
