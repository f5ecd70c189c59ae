"""`extrapos ruler` end to end on a tiny run trained on synthetic:ruler, the compare column, and bad input:
one sentence naming the fix, exit status 2, nothing written."""

import json

import pytest

from extrapos.cli import main
from extrapos.compare.tasks import parse_task_specs
from extrapos.data import prepare_data
from extrapos.errors import UserError
from extrapos.tasks.ruler import RulerOptions, ruler

SPEC = "synthetic:ruler:length=80,train=32,val=4,test=4,digits=2,pairs=2,queries=1"


@pytest.fixture(scope="module")
def ruler_run(tmp_path_factory):
    """A 2-step cpu/tiny run on synthetic:ruler (L_t = 80)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    tmp = tmp_path_factory.mktemp("ruler")
    cfg = load_config(
        "cpu/tiny",
        [
            f'data.corpus="{SPEC}"',
            'data.tokenizer="synthetic"',
            'data.sampler="synthetic"',
            f'data.dir="{prepare_data(SPEC, "synthetic", tmp / "d", progress=False)}"',
            "model.vocab_size=83",
            "model.train_length=80",
            "train.steps=2",
            "train.batch_size=4",
            "train.threads=1",
        ],
    )
    train(cfg, tmp / "run", progress=False)
    return tmp / "run"


def test_cli_scores_every_task_and_length_writes_the_result_and_the_plot(ruler_run, tmp_path, capsys):
    args = ["ruler", str(ruler_run), "--tasks", "niah_single,niah_multikey,cwe", "--lengths", "1,2"]
    args += ["--trials", "3", "--mode", "both", "--candidates", "4", "--digits", "2", "--pairs", "2"]
    args += ["--queries", "1", "--plot", str(tmp_path / "grid.png"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    result = json.loads((ruler_run / "eval" / "ruler-both-filler.json").read_text())
    assert [(c["task"], c["ev"], c["length"], c["n"]) for c in result["results"]] == [
        (t, k, 80 * k, 3) for k in (1, 2) for t in ("niah_single", "niah_multikey", "cwe")
    ]
    for c in result["results"]:
        assert 0 <= c["rank_accuracy"] <= 1 and c["exact_match"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert out.count("ruler both (") == 1 and out.count("| niah_multikey |") == 4  # one grid per metric
    assert "1x (80) | 2x (160)" in out and "exact match (the same cells):" in out
    assert (tmp_path / "grid.png").stat().st_size > 1000
    # the same request is reused; a different one under the same name is refused and the file kept
    before = (ruler_run / "eval" / "ruler-both-filler.json").read_bytes()
    shape = {"trials": 3, "mode": "both", "candidates": 4, "pairs": 2, "queries": 1, "digits": 2}
    again = ruler(ruler_run, RulerOptions(["niah_single", "niah_multikey", "cwe"], [1, 2], **shape))
    assert again == result
    with pytest.raises(UserError, match="different evaluation"):
        ruler(ruler_run, tasks=["niah_single"], lengths=[1], **shape)
    assert (ruler_run / "eval" / "ruler-both-filler.json").read_bytes() == before


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--tasks", "niah_single,sorting"], "--tasks must list distinct RULER tasks"),
        (["--tasks", "cwe,cwe"], "--tasks must list distinct RULER tasks"),
        (["--lengths", "0"], "positive"),
        (["--trials", "0"], "trials must be a positive integer"),
        (["--mode", "guess"], "unknown RULER mode"),
        (["--candidates", "1"], "--candidates must be between 2"),
        (["--seed", "-1"], "--seed must be a non-negative integer"),
        (["--plot", "grid.pdf"], "ending in .png"),
        (["--tasks", "niah_multikey", "--pairs", "8", "--digits", "6"], "cannot hold every task"),
        (["--pairs", "2", "--queries", "3"], "--pairs and --queries need 1 <= queries <= pairs"),
        (["--digits", "0"], "--digits must be between 1 and 18"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(ruler_run, capsys, flags, fragment):
    before = sorted(p.name for p in (ruler_run / "eval").glob("*")) if (ruler_run / "eval").exists() else []
    lengths = [] if "--lengths" in flags else ["--lengths", "1"]
    code = main(["ruler", str(ruler_run), *lengths, "--no-progress", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "Traceback" not in err
    assert err.startswith("extrapos: error: ") and err.count("\n") == 0
    after = sorted(p.name for p in (ruler_run / "eval").glob("*")) if (ruler_run / "eval").exists() else []
    assert after == before


def test_compare_column_options_are_checked_before_training(tmp_path):
    specs = parse_task_specs(tmp_path / "s.toml", ["ruler"], {})
    assert specs.enabled() == ["ruler"] and specs.ruler.trials == 20 and len(specs.ruler.tasks) == 7
    with pytest.raises(UserError, match=r"s.toml: ruler.tasks must list distinct RULER tasks"):
        parse_task_specs(tmp_path / "s.toml", ["ruler"], {"ruler": {"tasks": ["sorting"]}})
    with pytest.raises(UserError, match=r"ruler.pairs and --queries need"):
        parse_task_specs(tmp_path / "s.toml", ["ruler"], {"ruler": {"pairs": 2, "queries": 3}})
