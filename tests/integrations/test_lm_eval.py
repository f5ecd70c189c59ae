"""The lm-evaluation-harness adapter, offline: three local tasks (a YAML + jsonl written here), one per
request type, whose per-document responses must equal a direct computation with the model."""

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

lm_eval = pytest.importorskip("lm_eval")

from extrapos.errors import UserError  # noqa: E402
from extrapos.inference.generate import generate_tokens  # noqa: E402
from extrapos.integrations.lm_eval import ExtraposLM, position_options, run_lm_eval  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402

CHOICE_DOCS = [
    {
        "question": "The people of the United States",
        "choices": ["are free", "is blue", "of Congress"],
        "label": 0,
    },
    {"question": "We must work", "choices": ["together", "the", "green grass"], "label": 0},
    {"question": "The Congress", "choices": ["shall", "and"], "label": 1},
]
TEXT_DOCS = [
    {"text": "Fellow citizens, the state of the Union is strong and the nation is at peace."},
    {"text": "We have made progress in the economy, in education and in the defense of freedom " * 3},
]
GEN_DOCS = [
    {"prompt": "The President of the United", "answer": "States"},
    {"prompt": "Mr. Speaker, Mr. Vice", "answer": "President"},
    {"prompt": "The Congress of the", "answer": "Union"},
]

YAML = {
    "xp_choice": """task: xp_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/choice.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
metadata:
  version: 1.0
""",
    "xp_rolling": """task: xp_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/text.jsonl
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
""",
    "xp_gen": """task: xp_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/gen.jsonl
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
metadata:
  version: 1.0
""",
}


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, docs in (("choice", CHOICE_DOCS), ("text", TEXT_DOCS), ("gen", GEN_DOCS)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    for name, text in YAML.items():
        (d / f"{name}.yaml").write_text(text.format(dir=d))
    return d


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    out = tmp_path_factory.mktemp("lm") / "rope"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 4})), out, progress=False)
    return out


def _direct_logprob(model, tok, context: str, continuation: str) -> float:
    """log p(continuation | context) from one full forward pass (the harness's context/continuation split)."""
    whole = tok.encode(context + continuation)
    n_ctx = len(tok.encode(context))
    x = torch.tensor([whole])
    with torch.no_grad():
        logp = F.log_softmax(model(x[:, :-1], torch.arange(len(whole) - 1)[None]).float(), -1)[0]
    return float(sum(logp[t - 1, whole[t]] for t in range(n_ctx, len(whole))))


@pytest.mark.slow  # lm-eval's task loading and evaluator: about 5 s on top of the fixtures
def test_three_request_types_match_a_direct_computation(tiny_run, task_dir):
    r = run_lm_eval(
        tiny_run,
        ["xp_choice", "xp_rolling", "xp_gen"],
        include_path=task_dir,
        include_defaults=False,
        max_length=128,
        batch_size=2,
        log_samples=True,
    )
    path = tiny_run / "eval" / "lm-eval-xp_choice_xp_rolling_xp_gen.json"
    assert json.loads(path.read_text())["results"] == r["results"]
    run = load_run(tiny_run)
    tok, model = run.tokenizer, run.model

    # loglikelihood (multiple choice): every choice's log-likelihood, and acc from their argmax
    samples = r["samples"]["xp_choice"]
    assert len(samples) == 3
    correct = 0
    for s in samples:
        doc = s["doc"]
        got = [float(resp[0][0]) for resp in s["resps"]]
        # the harness joins context and choice with its target delimiter, a space
        assert [a[1] for a in s["arguments"]] == [" " + c for c in doc["choices"]]
        want = [_direct_logprob(model, tok, doc["question"], " " + c) for c in doc["choices"]]
        assert got == pytest.approx(want, abs=1e-4)
        correct += int(max(range(len(want)), key=want.__getitem__) == doc["label"])
    assert r["results"]["xp_choice"]["acc,none"] == pytest.approx(correct / 3)

    # loglikelihood_rolling: the text's log-likelihood predicted from end-of-text (one window: 128 tokens)
    for s in r["samples"]["xp_rolling"]:
        text = s["doc"]["text"]
        ids = tok.encode(text)
        assert len(ids) < 128
        x = torch.tensor([[tok.eot_id] + ids])
        with torch.no_grad():
            logp = F.log_softmax(model(x[:, :-1], torch.arange(len(ids))[None]).float(), -1)[0]
        want = float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
        assert float(s["resps"][0][0]) == pytest.approx(want, abs=1e-4)

    # generate_until: greedy decoding with the cache, cut at the first stop string
    for s in r["samples"]["xp_gen"]:
        ids = tok.encode(s["doc"]["prompt"])
        ref = tok.decode(list(generate_tokens(model, ids, 6, temperature=0, eot_id=tok.eot_id)))
        for stop in ("\n", "."):
            ref = ref.split(stop)[0]
        assert s["resps"][0][0] == ref
    assert 0.0 <= r["results"]["xp_gen"]["exact_match,none"] <= 1.0


def test_rolling_windows_cover_every_token_once(tiny_run):
    """With a short max_length the text is scored in several windows: the total differs from the
    one-window score but every token is still predicted exactly once (the sum of window lengths)."""
    lm = ExtraposLM(run=str(tiny_run), max_length=16, batch_size=3)
    text = TEXT_DOCS[1]["text"]
    n = len(lm.tok_encode(text))
    assert n > 32

    class Req:
        args = (text,)

    windows = []
    original = lm.score_tokens

    def spy(pairs):
        windows.extend(pairs)
        return original(pairs)

    lm.score_tokens = spy
    short = lm.loglikelihood_rolling([Req()])[0]
    assert sum(len(cont) for _, cont in windows) == n and max(len(c) + len(x) for x, c in windows) <= 17
    long = ExtraposLM(run=str(tiny_run), max_length=256).loglikelihood_rolling([Req()])[0]
    assert math.isfinite(short) and short != pytest.approx(long)


def test_model_args_and_position_options(tiny_run):
    lm = lm_eval.api.registry.get_model("extrapos").create_from_arg_string(
        f"run={tiny_run},max_length=64,rope_scaling=linear"
    )
    assert isinstance(lm, lm_eval.api.model.LM) and lm.max_length == 64
    assert lm.options == {"scaling": "linear", "factor": 2.0}
    assert lm.model.pos.options.scaling == "linear" and lm.model.pos.options.factor == 2.0
    assert position_options(scale=0.5) == {"scale": 0.5}
    with pytest.raises(UserError, match="needs rope_scaling"):
        position_options(factor=2.0)
    with pytest.raises(UserError, match="run=RUN_DIR"):
        ExtraposLM()


def test_unknown_task_is_a_user_error(tiny_run, task_dir):
    with pytest.raises(UserError, match="no task"):
        run_lm_eval(tiny_run, ["no_such_task_xyz"], include_path=task_dir, include_defaults=False)


def test_requests_without_the_evaluator(tiny_run):
    """The fast path of the three request types: the adapter's answers equal direct computations."""
    from lm_eval.api.instance import Instance

    lm = ExtraposLM(run=str(tiny_run), max_length=64, batch_size=2)
    run = load_run(tiny_run)
    pairs = [("The people of the United States", " are free"), ("We must", " work together"), ("A", " B")]
    reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = [lp for lp, _ in lm.loglikelihood(reqs)]
    assert got == pytest.approx([_direct_logprob(run.model, run.tokenizer, c, x) for c, x in pairs], abs=1e-4)
    gen = lm.generate_until(
        [
            Instance("generate_until", {}, (c, {"until": ["."], "max_gen_toks": 5}), i)
            for i, (c, _) in enumerate(pairs)
        ]
    )
    for (c, _), text in zip(pairs, gen):
        ids = run.tokenizer.encode(c)
        ref = run.tokenizer.decode(
            list(generate_tokens(run.model, ids, 5, temperature=0, eot_id=run.tokenizer.eot_id))
        )
        assert text == ref.split(".")[0]


REMOTE_YAML = """task: xp_remote
dataset_path: extrapos-test/no-such-dataset
output_type: multiple_choice
test_split: test
doc_to_text: "{{question}}"
doc_to_target: 0
doc_to_choice: ["a", "b"]
metric_list:
  - metric: acc
"""


def test_an_unreachable_dataset_is_named_with_how_to_provide_it_offline(tiny_run, tmp_path, monkeypatch):
    """A task whose dataset is on the Hub, with the Hub unreachable (offline mode, an empty cache: what a
    machine without a network sees, without touching one): one sentence that says the dataset could not
    be fetched and how to provide it, not a file-system or free-space error; nothing written."""
    import datasets.config
    import huggingface_hub.constants

    for module in (datasets.config, huggingface_hub.constants):
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "xp_remote.yaml").write_text(REMOTE_YAML)
    before = sorted((tiny_run / "eval").glob("*")) if (tiny_run / "eval").exists() else []
    with pytest.raises(UserError) as refused:
        run_lm_eval(tiny_run, ["xp_remote"], limit=2, include_path=tmp_path / "tasks", include_defaults=False)
    sentence = str(refused.value)
    assert "could not fetch the dataset of xp_remote" in sentence and "no-such-dataset" in sentence
    assert "HF_DATASETS_OFFLINE=1" in sentence and "--include-path" in sentence
    assert "free space" not in sentence and sentence.count(". ") == 0
    assert (sorted((tiny_run / "eval").glob("*")) if (tiny_run / "eval").exists() else []) == before


@pytest.mark.slow  # lm-eval's own CLI: task loading and the evaluator, about 5 s on top of the fixtures
def test_lm_eval_own_cli_runs_the_extrapos_model(tiny_run, task_dir, tmp_path, monkeypatch, capsys):
    """``extrapos-lm-eval`` is lm-eval's command line with ``--model extrapos`` known to it."""
    from extrapos.integrations.lm_eval import cli

    argv = ["extrapos-lm-eval", "run", "--model", "extrapos", "--model_args", f"run={tiny_run}"]
    argv += ["--tasks", "xp_choice", "--include_path", str(task_dir), "--limit", "2", "--device", "cpu"]
    monkeypatch.setattr("sys.argv", argv)
    cli()
    out = capsys.readouterr().out
    assert "xp_choice" in out and "acc" in out


def test_the_cli_entry_point_registers_the_model():
    """What ``extrapos-lm-eval`` imports before lm-eval's CLI: the model is then in lm-eval's registry."""
    from lm_eval.api.registry import get_model

    import extrapos.integrations.lm_eval as adapter

    assert get_model("extrapos") is adapter.ExtraposLM


@pytest.mark.slow  # lm-eval's evaluator twice: about 10 s on top of the fixtures
def test_stderr_is_computed_as_lm_eval_does_by_default(tiny_run, task_dir, capsys, console):
    """`extrapos lm-eval` asks lm-eval for its default bootstrap_iters, so acc has its stderr (it used to
    say N/A); a result saved without stderr is scored again under the same name, not refused."""
    from extrapos.integrations.lm_eval import LM_EVAL_BOOTSTRAP_ITERS

    common = dict(include_path=task_dir, include_defaults=False, max_length=128, name="se", quiet=True)
    old = run_lm_eval(tiny_run, ["xp_choice"], bootstrap_iters=0, **common)
    assert old["results"]["xp_choice"]["acc_stderr,none"] == "N/A"
    new = run_lm_eval(tiny_run, ["xp_choice"], **common)
    assert new["request"]["bootstrap_iters"] == LM_EVAL_BOOTSTRAP_ITERS == 100_000
    stderr = new["results"]["xp_choice"]["acc_stderr,none"]
    acc = new["results"]["xp_choice"]["acc,none"]
    assert isinstance(stderr, float) and stderr == pytest.approx(math.sqrt(acc * (1 - acc) / 2), rel=1e-6)
    assert "no stderr (bootstrap_iters 0); scoring it again" in capsys.readouterr().out


def test_lm_eval_help_shows_the_routes_that_work(capsys):
    from extrapos.cli import main

    with pytest.raises(SystemExit):
        main(["lm-eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "extrapos-lm-eval run --model extrapos --model_args run=RUN" in text
    assert "lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True" in text
    assert "--bootstrap-iters" in text


def test_lm_evals_own_flag_spellings_are_accepted():
    """A command line written for lm_eval (--num_fewshot, --include_path, ...) means the same here."""
    from extrapos.cli import build_parser

    values = {"num-fewshot": "2", "batch-size": "4", "include-path": "tasks", "bootstrap-iters": "0"}
    values["max-length"] = "64"
    ours = [f"--{k}={v}" for k, v in values.items()] + ["--log-samples"]
    theirs = [f"--{k.replace('-', '_')}={v}" for k, v in values.items()] + ["--log_samples"]
    parsed = [vars(build_parser().parse_args(["lm-eval", "RUN", "--tasks", "x", *f])) for f in (ours, theirs)]
    assert parsed[0] == parsed[1]
    assert parsed[1]["num_fewshot"] == 2 and parsed[1]["include_path"] == "tasks" and parsed[1]["log_samples"]


def test_metrics_are_shown_with_their_stderr():
    from extrapos.integrations.lm_eval_task import shown_metrics

    shown = shown_metrics({"alias": "x", "acc,none": 0.5, "acc_stderr,none": 0.25, "ppl,none": 3.0})
    assert shown == "acc,none 0.5000 ± 0.2500, ppl,none 3.0000"


def ruler_task_dir():
    """lm-eval's own RULER task folder (its YAMLs import wonderwords and nltk: lm_eval[ruler])."""
    pytest.importorskip("wonderwords")
    pytest.importorskip("nltk")
    from pathlib import Path

    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "ruler"


@pytest.mark.slow  # lm-eval's RULER task loading (its 500 prompts per length) and one generation: ~10 s
def test_lm_evals_ruler_runs_with_the_exported_tokenizer(tiny_run, tmp_path):
    """lm-eval's noise-haystack RULER task through the registered model (docs/results/ruler/lm-eval.md): it
    sizes its prompts with the tokenizer named in the metadata, the run's as `extrapos export` writes it,
    which counts exactly the tokens the model reads; without one, a sentence says what to add, nothing
    written."""
    from transformers import AutoTokenizer

    from extrapos.integrations.hf.exporter import export_pretrained

    tasks = ruler_task_dir()
    before = sorted((tiny_run / "eval").glob("*")) if (tiny_run / "eval").exists() else []
    with pytest.raises(UserError) as refused:
        run_lm_eval(tiny_run, ["niah_single_1"], limit=1, max_length=512, include_path=tasks,
                    include_defaults=False, metadata={"max_seq_lengths": [512]})  # fmt: skip
    sentence = str(refused.value)
    assert '"tokenizer": "DIR" to --metadata' in sentence and "extrapos export" in sentence
    assert "--model_args" not in sentence
    assert (sorted((tiny_run / "eval").glob("*")) if (tiny_run / "eval").exists() else []) == before

    hf = export_pretrained(tiny_run, tmp_path / "hf")
    out = run_lm_eval(tiny_run, ["niah_single_1"], limit=1, max_length=512, include_path=tasks,
                      include_defaults=False, metadata={"max_seq_lengths": [512], "tokenizer": str(hf)},
                      log_samples=True, name="lm-eval-ruler-test")  # fmt: skip
    assert 0.0 <= out["results"]["niah_single_1"]["512,none"] <= 1.0
    (sample,) = out["samples"]["niah_single_1"]
    prompt, kwargs = sample["arguments"][0]
    assert prompt.endswith(sample["doc"]["gen_prefix"]) and sample["doc"]["outputs"][0] in prompt
    run = load_run(tiny_run)
    assert AutoTokenizer.from_pretrained(str(hf))(prompt).input_ids == run.tokenizer.encode(prompt)
    # lm-eval sized the document (prompt before its answer prefix + generation budget) within the length
    assert sample["doc"]["length"] <= 512 and kwargs["max_gen_toks"] == 128


def test_lm_eval_under_no_progress_writes_only_its_own_lines(tiny_run, tmp_path, monkeypatch, capfd):
    """`extrapos lm-eval ... --no-progress` on a local task: its result lines on stdout and nothing on stderr,
    not lm-eval's task warnings, datasets' or lm-eval's progress bars, nor git's "fatal: not a git
    repository" (issue 48: a failure's one sentence came below them)."""
    import datasets.config
    import lm_eval.tasks.manager
    from lm_eval.tasks._index import TaskIndex

    from extrapos.cli import main

    # the harness's own 14,000 task files left unindexed (15 s); only --include-path's folder is read
    bundled, build = Path(lm_eval.tasks.manager.__file__).parent, TaskIndex.build

    def build_included(paths, **kw):
        return build([p for p in paths if Path(p) != bundled], **kw)

    monkeypatch.setattr(TaskIndex, "build", staticmethod(build_included))
    # what the command meets: no handler on the root logger (pytest's own would hide lm-eval's warnings from
    # logging's last-resort handler), datasets' data not yet prepared (its bar), a folder outside git
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CHOICE_DOCS))
    (tasks / "xp_choice.yaml").write_text(YAML["xp_choice"].format(dir=tasks))
    monkeypatch.chdir(tmp_path)
    args = ["lm-eval", str(tiny_run), "--tasks", "xp_choice", "--include-path", str(tasks), "--limit", "2"]
    assert main([*args, "--batch-size", "2", "--name", "quiet", "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    assert out.startswith("xp_choice: acc,none ") and out.count("\n") == 1


def test_quiet_harness_puts_everything_back_and_a_program_still_hears_lm_eval(caplog):
    """What ``quiet_harness`` changes is put back on the way out; inside, lm-eval's warnings reach a program's
    own handlers as before and extrapos' logger at DEBUG."""
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.evaluator
    from datasets.utils.tqdm import are_progress_bars_disabled

    from extrapos.integrations.lm_eval_quiet import quiet_harness

    def state():
        return (
            list(logging.getLogger("lm_eval").handlers),
            logging.getLogger("datasets").level,
            lm_eval.api.task.tqdm,
            lm_eval.api.model.tqdm,
            lm_eval.evaluator.get_git_commit_hash,
            are_progress_bars_disabled(),
        )

    before = state()
    with caplog.at_level(logging.DEBUG, logger="extrapos"), quiet_harness(progress=False):
        assert (
            logging.getLogger("datasets").getEffectiveLevel() == logging.ERROR
            and are_progress_bars_disabled()
        )
        assert (
            lm_eval.api.task.tqdm is not before[2] and lm_eval.evaluator.get_git_commit_hash is not before[4]
        )
        logging.getLogger("lm_eval.api.task").warning(
            "[Task: t] metric acc is defined, but aggregation is not."
        )
    assert state() == before
    heard = [(r.name, r.levelno) for r in caplog.records if "aggregation is not" in r.getMessage()]
    assert sorted(heard) == [
        ("extrapos.integrations.lm_eval_quiet", logging.DEBUG),
        ("lm_eval.api.task", logging.WARNING),
    ]
