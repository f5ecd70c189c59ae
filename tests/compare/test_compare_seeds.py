"""Seeds, baselines and intervals in comparison reports: seeds change the model and the data order but never
the evaluation targets; reports re-render byte for byte; results saved before per-document data still
render."""

import json

import pytest
import torch

from extrapos.compare import compare, load_sweep
from extrapos.errors import UserError
from tests.conftest import tiny_overrides


def _sweep(tmp_path, tiny_data, extra=""):
    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 4})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "tiny seeds"\ntrain = "cpu/tiny"\nlengths = [1, 2]\nmax_eval_tokens = 256\n'
        f"set = {json.dumps(sets)}\n{extra}"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "ExPE"\npositions = { name = "expe" }\n'
        '[[rows]]\nname = "ExPE x0.5"\nreuse = "ExPE"\neval = { scale = 0.5 }\n'
    )
    return f


@pytest.fixture(scope="module")
def seeded(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("seeded")
    spec = _sweep(root, tiny_data, 'seeds = [0, 1]\nbaseline = "ExPE"\n')
    out = root / "out"
    compare(str(spec), out, progress=False)
    return out


def _outputs(out):
    files = ["report.md", "results.csv", "results.json", "plots/loss_vs_length.png", "plots/per_position.png"]
    return {f: (out / f).read_bytes() for f in files}


def test_every_row_is_trained_once_per_seed_on_the_same_targets(seeded):
    runs = sorted(p.name for p in (seeded / "runs").iterdir())
    assert runs == ["expe-seed0", "expe-seed1", "rope-seed0", "rope-seed1"]
    merged = json.loads((seeded / "merged" / "expe.json").read_text())
    assert merged["seed_values"] == [0, 1] and len(merged["seeds"]) == 2
    a, b = (part["results"][1] for part in merged["seeds"])
    assert a["doc_index"] == b["doc_index"] and a["doc_tokens"] == b["doc_tokens"]  # same targets
    assert a["loss"] != b["loss"]  # a different model
    assert merged["results"][1]["loss"] == pytest.approx((a["loss"] + b["loss"]) / 2)
    configs = [(seeded / "runs" / f"rope-seed{s}" / "config.toml").read_text() for s in (0, 1)]
    assert "seed = 0" in configs[0] and "seed = 1" in configs[1]


def test_seeds_change_initialisation_and_data_order_but_not_targets(tiny_data, tmp_path):
    from extrapos.data import open_split
    from extrapos.evaluate import collect_spans
    from extrapos.run.config import load_config
    from extrapos.training.trainer import Trainer

    trainers = []
    for seed in (0, 1):
        cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.seed": seed}))
        (tmp_path / f"s{seed}").mkdir()
        trainers.append(Trainer(cfg, tmp_path / f"s{seed}", torch.device("cpu"), progress=False))
    a, b = trainers
    assert not torch.equal(next(a.model.parameters()), next(b.model.parameters()))  # initialisation
    assert not torch.equal(a.sampler.next_batch().tokens, b.sampler.next_batch().tokens)  # data order
    # the held-out targets come from the prepared split, which no training seed touches
    (spans_a, *_, docs_a), (spans_b, *_, docs_b) = (
        collect_spans(open_split(t.cfg.data.dir, "test"), 32, 256, with_documents=True) for t in trainers
    )
    assert (spans_a == spans_b).all() and (docs_a == docs_b).all()


def test_seeded_report_gives_intervals_spread_and_differences(seeded):
    text = (seeded / "report.md").read_text()
    assert "Difference to the baseline row (ExPE)" in text and "| ExPE | baseline | baseline |" in text
    assert "Spread across seeds" in text and "| RoPE | 2 |" in text and " ± " in text
    assert "crossed with the training seeds" in text and "(no interval)" not in text
    table = text.split("Mean token loss")[1]
    rope = next(line for line in table.splitlines() if line.startswith("| RoPE |"))
    assert rope.count("[") == 2  # one interval per length
    csv_lines = (seeded / "results.csv").read_text().splitlines()
    assert "loss_low" in csv_lines[0] and all(line.split(",")[15] for line in csv_lines[1:] if "RoPE" in line)


def test_few_seeds_print_each_seed_and_the_t_interval_over_them(seeded):
    """Below 5 seeds the report quotes each seed's difference (the same seed's baseline) and Student's t
    interval over them, computed here by hand from the merged per-seed losses."""
    import math
    import statistics

    text = (seeded / "report.md").read_text()
    assert "Over the seeds alone, difference to the baseline (ExPE, the same seed)" in text
    assert "Over the seeds alone, change with length" in text
    rope = json.loads((seeded / "merged" / "rope.json").read_text())
    expe = json.loads((seeded / "merged" / "expe.json").read_text())
    diffs = [r["results"][1]["loss"] - e["results"][1]["loss"] for r, e in zip(rope["seeds"], expe["seeds"])]
    half = 12.706 * statistics.stdev(diffs) / math.sqrt(2)  # t(0.975, 1 degree of freedom)
    mean = statistics.fmean(diffs)
    cell = f"{diffs[0]:+.3f}, {diffs[1]:+.3f}; t [{mean - half:+.3f}, {mean + half:+.3f}]"
    section = text.split("Over the seeds alone, difference")[1].split("Over the seeds alone, change")[0]
    line = next(line for line in section.splitlines() if line.startswith("| RoPE |"))
    assert cell in line.split(" | ")[2]  # ev=2, after the name and ev=1
    assert "| ExPE |" not in section  # the baseline has no difference to itself


def test_five_seeds_or_one_print_no_t_interval():
    from extrapos.report import render

    def row(name, losses):
        parts = [{"results": [{"ev": 1, "loss": v}, {"ev": 2, "loss": v + 0.1}]} for v in losses]
        mean = sum(losses) / len(losses)
        doc = {"results": [{"ev": 1, "loss": mean}, {"ev": 2, "loss": mean + 0.1}]}
        return render.Row(name, {**doc, "seeds": parts if len(losses) > 1 else [], "seed_values": None})

    five = [row("A", [1.0, 1.1, 1.2, 1.3, 1.4]), row("B", [2.0, 2.1, 2.2, 2.3, 2.4])]
    assert render.seed_t_table(five, five[0]) is None and render.seed_t_table(five, None) is None
    one = [row("A", [1.0]), row("B", [2.0])]
    assert render.seed_t_table(one, one[0]) is None
    three = [row("A", [1.0, 1.1, 1.2]), row("B", [2.0, 2.3, 2.2])]
    table = render.seed_t_table(three, three[0])
    assert table is not None and "| B | +1.000, +1.200, +1.000; t [" in table


def test_report_rerenders_byte_identically(seeded):
    from extrapos.cli import main

    before = _outputs(seeded)
    assert main(["report", str(seeded)]) == 0
    assert _outputs(seeded) == before


def test_results_saved_before_per_document_data_still_render(tiny_data, tmp_path):
    from extrapos.cli import main

    out = tmp_path / "out"
    compare(str(_sweep(tmp_path, tiny_data)), out, progress=False)
    assert "(no interval)" not in (out / "report.md").read_text()
    for f in (out / "runs").rglob("eval/*.json"):  # strip what older versions did not record
        data = json.loads(f.read_text())
        for row in data["results"]:
            for key in ("doc_index", "doc_loss_sums", "doc_tokens", "seq_ppl"):
                row.pop(key)
        f.write_text(json.dumps(data))
    assert main(["report", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert text.count("(no interval)") == 2 * 3 * 2 + 1  # every loss and perplexity cell, and the note why
    assert "| ExPE | – | – |" in text  # no paired difference either
    assert "# tiny seeds" in text  # the sweep's title, saved for re-rendering


def test_sweep_checks_baseline_and_seeds(tmp_path, tiny_data):
    with pytest.raises(UserError, match="baseline 'Nope' is not a row"):
        load_sweep(str(_sweep(tmp_path, tiny_data, 'baseline = "Nope"\n')))
    with pytest.raises(UserError, match="distinct non-negative"):
        load_sweep(str(_sweep(tmp_path, tiny_data, "seeds = [1, 1]\n")))
    with pytest.raises(UserError, match="seeds"):
        load_sweep(str(_sweep(tmp_path, tiny_data, 'seeds = ["a"]\n')))


def test_quick_seeds_is_the_quick_sweep_once_per_seed():
    from extrapos.compare import row_config

    quick, seeded = load_sweep("quick"), load_sweep("quick-seeds")
    assert seeded.seeds == [0, 1, 2] and seeded.baseline == quick.baseline == "RoPE"
    assert [r.positions for r in seeded.rows] == [r.positions for r in quick.rows]
    assert (seeded.set, seeded.lengths, seeded.max_eval_tokens) == (
        quick.set,
        quick.lengths,
        quick.max_eval_tokens,
    )
    for row in quick.rows:  # seed 0 is the quick table's own run
        assert row_config(seeded, row, ["train.seed=0"]).to_toml() == row_config(quick, row, []).to_toml()


@pytest.mark.slow
def test_seeded_extension_sweep_pairs_columns_and_gives_the_papers_aggregate(tiny_data, tmp_path):
    from extrapos.cli import main

    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 2})
    spec = tmp_path / "ext.toml"
    spec.write_text(
        'title = "tiny extension"\ntrain = "cpu/tiny"\nlengths = [2, 4]\nmax_eval_tokens = 128\n'
        f'eval_each_length = true\nextend_tokens = 128\nseeds = [0, 1]\nbaseline = "RoPE full"\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE OOTB"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "RoPE chunk-0.5"\nextend = { from = "RoPE OOTB", method = "chunk", alpha = 0.5, '
        "factor = [2, 4] }\n"
        '[[rows]]\nname = "RoPE full"\nextend = { from = "RoPE OOTB", method = "full", factor = [2, 4] }\n'
    )
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert "rope-chunk-0-5-x4-seed1" in runs and "rope-ootb-seed0" in runs and len(runs) == 2 + 2 * 2 * 2
    parent = json.loads((out / "runs" / "rope-full-x2-seed1" / "parent.json").read_text())
    assert parent["parent"].endswith("rope-ootb-seed1")  # an extension continues its own seed's base model
    text = (out / "report.md").read_text()
    assert "each column scores its own spans" in text and "Karypis et al. eq. 3" in text
    chunk = next(
        line
        for line in text.split("Difference to the baseline")[1].splitlines()
        if line.startswith("| RoPE chunk-0.5 |")
    )
    assert chunk.count("[") == 2  # paired within each column
    before = _outputs(out)
    assert main(["report", str(out)]) == 0
    assert _outputs(out) == before
