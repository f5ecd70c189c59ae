"""Attention diagnostics as compare columns (issue 26 item 3): `attention = {...}` in a sweep adds, per row
and length, statistics of `extrapos attention` averaged over every layer and head, with intervals over the
documents, read from the same result slot `extrapos attention` writes."""

from __future__ import annotations

import json

import pytest

from extrapos.cli import main
from extrapos.compare import compare, load_sweep
from extrapos.errors import UserError


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    out = tmp_path_factory.mktemp("compare-attention") / "rope"
    overrides = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 3})
    train(load_config("cpu/tiny", overrides), out, progress=False)
    return out


# the train split: documents enough for intervals (the test split of tiny_data holds fewer than 5)
COLUMNS = '{ max_tokens = 640, split = "train" }'


def _sweep(tmp_path, run, attention: str = COLUMNS) -> object:
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "attention"\nlengths = [1, 2, 4]\nloss = false\ntasks = ["attention"]\n'
        f"attention = {attention}\n"
        f'[[rows]]\nname = "RoPE"\nrun = "{run}"\n'
        '[[rows]]\nname = "RoPE ntk"\nreuse = "RoPE"\neval = { scaling = "ntk", factor = 4.0 }\n'
    )
    return f


def test_attention_columns_equal_the_attention_command(tiny_run, tmp_path, capsys):
    from extrapos.evaluate.attention_stats import statistic_interval
    from extrapos.tasks.attention_task import attention_value

    out = tmp_path / "out"
    text = compare(str(_sweep(tmp_path, tiny_run)), out, progress=False).read_text()
    assert "Mean attended distance (tokens):" in text and "Entropy (nats):" in text
    entries = json.loads((out / "rows.json").read_text())
    rows = {e["name"]: json.loads((out / e["tasks"]["attention"]).read_text()) for e in entries}

    # the same diagnostics run directly: every value and interval of the column is the command's
    for row, flags in (("RoPE", []), ("RoPE ntk", ["--rope-scaling", "ntk", "--factor", "4"])):
        direct_args = [
            "attention",
            str(tiny_run),
            "--lengths",
            "1,2,4",
            "--max-tokens",
            "640",
            "--split",
            "train",
        ]
        name = "direct-" + row.replace(" ", "-")
        assert main([*direct_args, *flags, "--name", name, "--no-progress"]) == 0
        direct = json.loads((tiny_run / "attention" / f"{name}.json").read_text())
        assert direct["applied"] == rows[row]["applied"]
        for mine, theirs in zip(rows[row]["results"], direct["results"]):
            assert mine["ev"] == theirs["ev"]
            for stat in ("mean_distance", "entropy"):
                value = attention_value(theirs, stat)
                assert attention_value(mine, stat) == value
                iv, _ = statistic_interval(theirs, stat)
                assert iv is not None
                cell = f"{value:.1f}" if stat == "mean_distance" else f"{value:.3f}"
                low, high = (f"{x:.1f}" if stat == "mean_distance" else f"{x:.3f}" for x in (iv.low, iv.high))
                cell += f" [{low}, {high}]"
                assert cell in text, (row, stat, cell)
    csv = (out / "tasks.csv").read_text()
    assert "RoPE ntk,attention,4,64,,mean_distance," in csv

    # a resumed sweep reads the saved diagnostics through the slot: nothing is computed or written again
    saved = sorted((tiny_run / "attention").glob("attention-*.json"))
    assert len(saved) == 2
    stamps = [p.stat().st_mtime_ns for p in saved]
    again = compare(str(_sweep(tmp_path, tiny_run)), out, progress=False).read_text()
    assert again.split("Attention diagnostics")[1] == text.split("Attention diagnostics")[1]
    assert [p.stat().st_mtime_ns for p in saved] == stamps
    # the statistics shown change no result: the same diagnostics, other columns
    f = _sweep(tmp_path, tiny_run, '{ max_tokens = 640, split = "train", statistics = ["median_weight"] }')
    shown = compare(str(f), out, progress=False).read_text()
    assert "Median weight x n:" in shown and "Mean attended distance" not in shown
    assert [p.stat().st_mtime_ns for p in saved] == stamps
    before = (out / "report.md").read_bytes()
    assert main(["report", str(out)]) == 0  # the report is rebuilt byte for byte from the saved rows
    assert (out / "report.md").read_bytes() == before
    capsys.readouterr()


@pytest.mark.parametrize(
    "attention, message",
    [
        ('{ statistics = ["distance"] }', "attention.statistics must list distinct names from entropy"),
        ("{ statistics = [] }", "attention.statistics must list distinct names"),
        ('{ statistics = ["entropy", "entropy"] }', "attention.statistics must list distinct names"),
        ("{ max_tokens = 0 }", "attention.max_tokens must be a positive number of tokens"),
        ('{ split = "dev" }', "attention.split must be train, val or test"),
        ("{ lengths = [1] }", "attention has no option 'lengths'"),
    ],
)
def test_bad_attention_options_are_one_sentence(tmp_path, attention, message):
    f = _sweep(tmp_path, tmp_path / "no-run-needed", attention)
    with pytest.raises(UserError, match=message) as refused:
        load_sweep(str(f))
    assert "\n" not in str(refused.value)


def test_attention_options_need_the_task_listed(tmp_path):
    f = tmp_path / "sweep.toml"
    f.write_text('train = "cpu/tiny"\nattention = {}\n[[rows]]\nname = "R"\npositions = { name = "rope" }\n')
    with pytest.raises(UserError, match='tasks does not list "attention"'):
        load_sweep(str(f))
