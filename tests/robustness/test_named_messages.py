"""Messages that name what is wrong, in the command line's words (issue 48, item 7).

* a directory, ``/dev/zero`` or a FIFO given to ``--prompt-file`` or ``--squad`` was "does not exist" (and
  reading a FIFO or /dev/zero would block or never end): each is named for what it is;
* a tokenizer that yields no tokens was "Every document of 'sotu' is empty": the text is there, the
  tokenizer is what drops it;
* ``doctor --json nodir/x/doc.json`` ran the whole check and then named its temporary file: refused before
  the check, naming the missing folder;
* passkey and RULER collisions said "--name (name=...)" and "--overwrite (overwrite=True)", library syntax
  in a command's sentence;
* RULER's default result name ignored the lengths, the seed and the tasks, so a second, different request
  collided with the first: the name now holds what tells requests apart.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from harness import assert_one_sentence_error, run

from extrapos.cli import main
from extrapos.errors import UserError
from tests.conftest import tiny_overrides


def _special(kind: str, scratch: Path) -> Path:
    if kind == "a directory":
        path = scratch / "folder"
        path.mkdir()
        return path
    if kind == "a FIFO":
        path = scratch / "pipe"
        os.mkfifo(path)
        return path
    return Path("/dev/zero")


SPECIAL = {"a directory": "is a directory", "a FIFO": "is a FIFO", "/dev/zero": "is a character device"}


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_prompt_file_that_is_not_a_file_is_named(kind, scratch, cache):
    path = _special(kind, scratch)
    result = run(["generate", scratch / "run", "--prompt-file", path], cache=cache, timeout=60)
    sentence = assert_one_sentence_error(result, f"prompt file {path} {SPECIAL[kind]}", "text file")
    assert "does not exist" not in sentence


@pytest.mark.parametrize("kind", list(SPECIAL))
@pytest.mark.parametrize("dataset", ["squad", "hotpotqa"])
def test_qa_file_that_is_not_a_file_is_named(dataset, kind, scratch):
    from extrapos.data.ruler_qa import load_qa

    path = _special(kind, scratch)
    with pytest.raises(UserError) as e:
        load_qa(dataset, path)
    sentence = str(e.value)
    assert f"{path} {SPECIAL[kind]}" in sentence and f"--{dataset}" in sentence
    assert "does not exist" not in sentence
    with pytest.raises(UserError, match=f"does not exist; pass --{dataset}"):  # a missing file still is
        load_qa(dataset, scratch / "missing.json")


def test_a_tokenizer_that_yields_no_tokens_is_named(corpus, scratch):
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE

    from extrapos.data import prepare_data

    tokenizer = Tokenizer(BPE(vocab={"#": 0}, merges=[]))  # no unknown token: every other byte is dropped
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tokenizer.save(str(scratch / "tokenizer.json"))
    with pytest.raises(UserError) as e:
        prepare_data(str(corpus), str(scratch / "tokenizer.json"), scratch / "data", progress=False)
    sentence = str(e.value)
    assert "tokenizer" in sentence and "no tokens" in sentence and "8 documents" in sentence
    assert "is empty" not in sentence and sentence.count(". ") == 0


def test_doctor_json_in_a_missing_folder_is_refused_before_the_check(scratch, monkeypatch, capsys):
    import extrapos.tools.doctor as doctor

    def ran(*_, **__):
        raise AssertionError("the check ran before --json was refused")

    monkeypatch.setattr(doctor, "doctor", ran)
    target = scratch / "nodir" / "x" / "doc.json"
    code = main(["doctor", "--json", str(target), "--encodings", "rope", "--no-speed", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("extrapos: error: ") and err.count("\n") == 0
    assert f"the folder {scratch / 'nodir' / 'x'} does not exist" in err and ".tmp" not in err
    assert not (scratch / "nodir").exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2})), run_dir, progress=False)
    return run_dir


def test_a_task_collision_is_said_in_the_command_line_s_words(trained, scratch, cache):
    out = scratch / "run"
    shutil.copytree(trained, out)
    passkey = ["passkey", out, "--lengths", "4", "--trials", "1", "--name", "pk", "--no-progress"]
    first = run(passkey, cache=cache)
    assert first.returncode == 0, first.stderr
    second = run([*passkey, "--seed", "1"], cache=cache)
    sentence = assert_one_sentence_error(second, "holds a different evaluation", "--name", "--overwrite")
    assert "name=" not in sentence and "overwrite=True" not in sentence


def test_ruler_default_names_tell_requests_apart():
    from extrapos.tasks.ruler import RulerOptions, default_name

    base = RulerOptions(tasks=["niah_single_1", "vt"], lengths=[1, 2], seed=0)
    others = [
        replace(base, lengths=[1, 4]),
        replace(base, seed=1),
        replace(base, tasks=["niah_single_1"]),
        replace(base, trials=5),
        replace(base, position_options={"scale": 0.5}),
        replace(base, step=4),
    ]
    names = [default_name(o) for o in [base, *others]]
    assert len(set(names)) == len(names), names
    assert default_name(replace(base)) == names[0]  # an equal request keeps its name (it is reused)
    assert names[0].startswith("ruler-generate-ruler-ev1_2-")
    many = replace(base, lengths=list(range(1, 200)), position_options={f"k{i}": "v" * 50 for i in range(9)})
    from extrapos.evaluate import check_result_name

    assert check_result_name(default_name(many))  # a plain file name of at most 120 characters
