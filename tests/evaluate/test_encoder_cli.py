"""`extrapos eval` on an encoder run: the masked-LM protocol, its flags, and one-sentence refusals."""

import json

import pytest

from extrapos.cli import main
from extrapos.evaluate import EvalRequest
from extrapos.evaluate.mlm import evaluate_mlm
from tests.conftest import encoder_overrides, tiny_overrides


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run = tmp_path_factory.mktemp("runs") / "encoder"
    train(
        load_config("cpu/tiny", encoder_overrides(tiny_data, **{"model.positions": '"alibi"'})),
        run,
        progress=False,
    )
    return run


def test_eval_of_an_encoder_run_prints_and_saves_the_mlm_table(encoder_run, capsys):
    args = ["eval", str(encoder_run), "--lengths", "1,2,4", "--max-tokens", "512", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "(masked LM, mask seed 0)" in out and "| ev | window | MLM loss | ppl | accuracy | tail loss |" in out
    )
    saved = json.loads((encoder_run / "eval" / "mlm-test.json").read_text())
    direct = evaluate_mlm(
        encoder_run, EvalRequest(lengths=[1, 2, 4], max_tokens=512), name="direct", progress=False
    )
    assert [r["loss"] for r in saved["results"]] == [r["loss"] for r in direct["results"]]
    assert f"| 4 | 64 | {saved['results'][2]['loss']:.4f} |" in out
    # another mask seed: another result file, other masked tokens
    assert main([*args, "--mask-seed", "3"]) == 0
    other = json.loads((encoder_run / "eval" / "mlm-test-mask3.json").read_text())
    assert (
        other["mask_seed"] == 3
        and other["results"][0]["doc_loss_sums"] != saved["results"][0]["doc_loss_sums"]
    )


def test_eval_flags_that_do_not_apply_are_one_sentence(encoder_run, tiny_data, tmp_path, capsys):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    before = (
        sorted(p.name for p in (encoder_run / "eval").glob("*")) if (encoder_run / "eval").is_dir() else []
    )
    assert main(["eval", str(encoder_run), "--stride", "8", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("extrapos: error:") and "drop --stride" in err and "\n" not in err
    assert main(["eval", str(encoder_run), "--mask-seed", "-1", "--no-progress"]) == 2
    assert "non-negative" in capsys.readouterr().err
    after = (
        sorted(p.name for p in (encoder_run / "eval").glob("*")) if (encoder_run / "eval").is_dir() else []
    )
    assert after == before  # nothing written

    decoder = tmp_path / "decoder"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 1})), decoder, progress=False)
    assert main(["eval", str(decoder), "--mask-seed", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--mask-seed applies to encoder runs" in err and "drop it" in err and "\n" not in err
    assert not (decoder / "eval").exists()
