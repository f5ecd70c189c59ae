"""The battery (issue 24, item 6): every command, every flag, every config key, fed malformed values.

The cases are derived, never hand-listed, so a future flag or key is covered without writing anything:

- every leaf command of ``extrapos.cli.build_parser()`` (``data prepare`` and ``data info`` included)
  runs from a valid base command line (``BASES``, one per command: a command without one fails
  ``test_every_command_has_a_base``); each of its flags and positional arguments that takes a value is
  replaced, one at a time, by each malformed value of ``KINDS``;
- ``train --set KEY=VALUE`` and ``extend --set KEY=VALUE`` for every key of ``RunConfig`` (walked from the
  dataclasses of ``run/config.py`` and ``model.py``, plus the options of the run's encoding), ``eval
  --position-option KEY=VALUE`` for every option of the run's encoding, and every key of a compare sweep
  file (``Sweep`` and its ``[[rows]]``), each with every value of ``CONFIG_KINDS``.

Each case runs in-process (``extrapos.cli.main``) under a bound of the CPU time it uses
(``harness.bounded``: a loaded machine stretches the wall clock, not the work; a wall clock ten times larger
catches a hang that waits) and holds the contract: exit status 0 or 2 (never 70, never an uncaught
exception, never a timeout: a huge value is refused up front, not worked on), on exit 2 exactly one line
on stderr starting ``extrapos: error:``, no "Traceback" anywhere, stdout encodable as UTF-8 (a real
terminal would raise on a lone surrogate), and every file of the fixtures keeps its sha256.
``python -m pytest tests/robustness/test_battery.py --collect-only -q`` counts the cases;
``test_every_command_has_a_base`` prints the count by command.

A path where a name belongs is ``../x`` (relative to a per-case working directory) or an absolute path
inside the case's scratch directory (the battery never writes outside its temporary directories).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import io
import os
import re
import shutil
import typing
from collections import Counter
from pathlib import Path

import pytest
from harness import CaseTimeout, bounded

from extrapos.cli import build_parser, main
from tests.conftest import tiny_overrides

CPU_S = 8  # CPU seconds: a case is a few milliseconds to a second of work; more is unbounded work
# a case waiting this many times its CPU bound on the wall clock is a hang that does not compute (the
# two cores of a machine at load 12 give one process a sixth of a core)
WALL_FACTOR = 10
SURROGATES = os.fsdecode(b"\xff\xfe")  # how Python hands non-UTF-8 argv bytes to the program
PREFIX = "extrapos: error: "

# Malformed command-line values: "{abs}" is the case's own scratch directory (absolute).
KINDS = {
    "word": "abc",
    "empty": "",
    "negative": "-1",
    "zero": "0",
    "huge-float": "1e18",
    "huge-int": str(10**30),
    "nan": "nan",
    "inf": "inf",
    "non-utf8": SURROGATES,
    "parent-path": "../x",
    "absolute-path": "{abs}/x",
}

# Malformed config values, as TOML literals after KEY= (``--set`` reads them as TOML, else as a word).
CONFIG_KINDS = {
    "wrong-type": None,  # a string for a number, a number for a string: see wrong_type
    "empty": "",
    "negative": "-1",
    "zero": "0",
    "huge-float": "1e18",
    "huge-int": str(10**30),
    "nan": "nan",
    "inf": "inf",
    "non-utf8": SURROGATES,
    "parent-path": '"../x"',
    "absolute-path": '"{abs}/x"',
}

# The tiny run every command works on: one layer, d 16, L_t 16, two steps (tens of milliseconds).
TINY = {
    "model.n_layers": 1,
    "model.d_model": 16,
    "model.n_heads": 2,
    "model.train_length": 16,
    "train.batch_size": 2,
    "train.steps": 2,
    "train.eval_batches": 1,
    "train.warmup": 0,
}
SYNTHETIC = "synthetic:passkey:length=16,train=32,val=8,test=8,digits=2"


def sets(values: list[str]) -> list[str]:
    out = []
    for v in values:
        out += ["--set", v]
    return out


def tiny_sets(data) -> list[str]:
    return tiny_overrides(data, **TINY)


# ---- fixtures: trained once per module ----------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_data):
    """Everything a base command line needs, made once: a finished run, a synthetic run, a corpus, an
    evaluation result, a Hugging Face directory, lm-eval tasks, a compare sweep."""
    from extrapos.data import prepare_data
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    root = tmp_path_factory.mktemp("battery")
    run = root / "run"
    train(load_config("cpu/tiny", tiny_sets(tiny_data)), run, progress=False)
    shutil.copytree(run, root / "cmp-run")  # compare's row: scored into its own run, apart from eval's result
    assert main(["eval", str(run), "--lengths", "1,2", "--max-tokens", "64", "--no-progress"]) == 0

    syn_data = prepare_data(SYNTHETIC, "synthetic", root / "syn-data", progress=False)
    syn_overrides = [f'data.corpus="{SYNTHETIC}"', 'data.tokenizer="synthetic"', 'data.sampler="synthetic"']
    syn = root / "syn"
    train(
        load_config(
            "cpu/tiny", tiny_overrides(syn_data, **{**TINY, "model.vocab_size": 128}) + syn_overrides
        ),
        syn,
        progress=False,
    )

    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(f"Document {i}. " + "the quick brown fox " * (20 + i))

    hf = root / "hf"
    _write_hf_model(hf)

    tasks = root / "tasks"
    _write_lm_eval_tasks(tasks)

    sweep = root / "sweep.toml"
    sweep.write_text(sweep_text(tiny_data, root / "cmp-run"))
    return {
        "root": root,
        "run": run,
        "syn": syn,
        "data": tiny_data,
        "corpus": corpus,
        "result": run / "eval" / "test.json",
        "hf": hf,
        "tasks": tasks,
        "sweep": sweep,
        "cmp-run": root / "cmp-run",
    }


def _write_hf_model(path: Path) -> None:
    """The one-layer Llama of test_import_inputs (config.json, weights, a small BPE tokenizer)."""
    import json

    from tests.integrations.hf_helpers import write_tokenizer
    from tests.robustness.test_import_inputs import CONFIG, _save, _tensors

    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    _save(_tensors(), path / "model.safetensors")
    write_tokenizer(path)


def _write_lm_eval_tasks(path: Path) -> None:
    import json

    from tests.integrations.test_lm_eval import CHOICE_DOCS, YAML

    path.mkdir()
    (path / "choice.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CHOICE_DOCS))
    (path / "xp_choice.yaml").write_text(YAML["xp_choice"].format(dir=path))


SWEEP_HEAD = {"lengths": "[1]", "max_eval_tokens": "64", "loss": "true"}


def sweep_text(data, run: Path, key: str | None = None, literal: str | None = None) -> str:
    """A one-row sweep over the finished run (nothing to train); ``key`` = ``literal`` replaces or adds one
    key of the sweep (``rows.KEY`` one of its row)."""
    head = {
        "train": '"cpu/tiny"',
        **SWEEP_HEAD,
        "set": "[" + ", ".join('"' + o.replace('"', '\\"') + '"' for o in tiny_sets(data)) + "]",
    }
    row = {"name": '"r"', "run": f'"{run}"'}
    if key is not None:
        section, _, name = key.rpartition(".")
        (row if section == "rows" else head)[name] = literal
    lines = [f"{k} = {v}" for k, v in head.items()] + ["[[rows]]"] + [f"{k} = {v}" for k, v in row.items()]
    return "\n".join(lines) + "\n"


# ---- the base command lines ---------------------------------------------------------------------------


def _bases(w: dict, case: Path) -> dict[str, list[str]]:
    out = str(case / "out")
    run = str(w["run"])
    return {
        "data prepare": [
            "data", "prepare", "--corpus", str(w["corpus"]), "--tokenizer", str(w["run"] / "tokenizer.json"),
            "--out", out, "--split-fractions", "0.6,0.2,0.2", "--quiet",
        ],
        "data info": ["data", "info", str(w["data"])],
        "encodings": ["encodings", "--size", "cpu-tiny"],
        "train": [
            "train", "--config", "cpu/tiny", "--data", str(w["data"]), "--out", out, "--no-progress",
            *sets(tiny_sets(w["data"])),
        ],
        "presets": ["presets"],
        "extend": [
            "extend", run, "--method", "chunk", "--alpha", "0.25", "--factor", "2", "--tokens", "64", "--out",
            out, "--no-progress",
        ],
        "eval": ["eval", run, "--lengths", "1,2", "--max-tokens", "64", "--no-progress", "--device", "cpu"],
        "compare": ["compare", str(w["sweep"]), "--out", out, "--no-progress"],
        "report": ["report", str(w["result"]), "--out", out],
        "passkey": [
            "passkey", run, "--lengths", "8", "--depths", "0.5", "--trials", "1", "--candidates", "2",
            "--no-progress", "--device", "cpu",
        ],
        "synthetic-eval": [
            "synthetic-eval", str(w["syn"]), "--lengths", "1", "--examples", "2", "--no-progress", "--device",
            "cpu",
        ],
        "lm-eval": [
            "lm-eval", run, "--tasks", "xp_choice", "--include-path", str(w["tasks"]), "--limit", "2",
            "--batch-size", "2",
        ],
        # a command still being written elsewhere may be absent: only the commands that exist are run
        "attention": [
            "attention", run, "--lengths", "1,2", "--max-tokens", "64", "--no-progress", "--device", "cpu",
        ],
        "ruler": [
            "ruler", run, "--tasks", "niah_single_1", "--lengths", "16", "--trials", "1", "--candidates", "2",
            "--no-progress", "--device", "cpu",
        ],
        "import": ["import", str(w["hf"]), "--out", out],
        "export": ["export", run, "--out", out],
        "generate": ["generate", run, "--prompt", "The", "--max-new-tokens", "3", "--device", "cpu"],
        # --resolution-only: the timed benchmark itself takes minutes (tests/bench/test_bench.py covers it)
        "bench": ["bench", "--quick", "--resolution-only", "--no-progress", "--device", "cpu"],
        # one encoding, no timed step: the whole check is tests/tools/test_doctor.py's
        "doctor": ["doctor", "--encodings", "nope", "--no-speed", "--no-progress", "--device", "cpu"],
        # no export line: it loads transformers (tests/tools/test_conformance.py checks it)
        "check-encoding": [
            "check-encoding", "rope", "--option", "base=10000", "--no-export", "--device", "cpu",
        ],
    }  # fmt: skip


ROOT_PARSER: list[argparse.ArgumentParser] = []


@functools.cache
def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command that runs something, by its words ("data prepare")."""
    leaves = {}
    ROOT_PARSER[:] = [build_parser()]

    def walk(parser, words):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            leaves[" ".join(words)] = parser
            return
        for name, child in subs[0].choices.items():
            walk(child, [*words, name])

    walk(ROOT_PARSER[0], [])
    return leaves


def value_actions(parser) -> list[argparse.Action]:
    """The flags and positional arguments that take a value (not --help, --debug, store_true)."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and a.nargs != 0 and a.dest != "help"
    ]


def with_value(base: list[str], words: int, action: argparse.Action, value: str) -> list[str]:
    """``base`` with ``action`` given ``value`` (its earlier value, if any, removed)."""
    args = list(base)
    if action.option_strings:
        flags = set(action.option_strings)
        i = words
        while i < len(args):
            if args[i] in flags:
                del args[i : i + 2]
            else:
                i += 1
        return [*args, f"{action.option_strings[-1]}={value}"]
    # a positional: the nth word after the command's words that is not a flag or a flag's value
    parser = leaf_parsers()[" ".join(args[:words])]
    index = [a for a in parser._actions if not a.option_strings].index(action)
    i, seen = words, 0
    while i < len(args):
        if args[i].startswith("--"):
            takes = parser._option_string_actions[args[i].split("=")[0]].nargs != 0
            i += 1 + (takes and "=" not in args[i])
            continue
        if seen == index:
            args[i] = value
            return args
        seen += 1
        i += 1
    return [*args[:words], value, *args[words:]]


# ---- config keys --------------------------------------------------------------------------------------


def config_keys() -> dict[str, typing.Any]:
    """Every key ``--set`` can name, with its annotation: the RunConfig dataclasses walked, ``model.size``
    (a preset applied first) and the options of the fixture's encoding (rope)."""
    from extrapos.run.config import RunConfig

    keys: dict[str, typing.Any] = {"model.size": str}

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{f.name}.")
            else:
                keys[f"{prefix}{f.name}"] = hint

    walk(RunConfig, "")
    for key, hint in encoding_keys("rope").items():
        keys[f"model.positions.{key}"] = hint
    return keys


def encoding_keys(name: str) -> dict[str, typing.Any]:
    from extrapos.positions.registry import spec

    options = spec(name).cls.Options
    hints = typing.get_type_hints(options)
    return {f.name: hints[f.name] for f in dataclasses.fields(options)}


def sweep_keys() -> dict[str, typing.Any]:
    from extrapos.compare import Sweep, SweepRow

    sweep, row = typing.get_type_hints(Sweep), typing.get_type_hints(SweepRow)
    keys = {f.name: sweep[f.name] for f in dataclasses.fields(Sweep) if f.name != "rows"}
    keys.update({f"rows.{f.name}": row[f.name] for f in dataclasses.fields(SweepRow)})
    return keys


def _is_str(hint) -> bool:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint is str or (bool(args) and all(a is str for a in args))


def wrong_type(hint) -> str:
    """A TOML literal of another type than ``hint``: a string for a number or a flag, a number for a
    string, a list, a table."""
    return "[1]" if _is_str(hint) else '"abc"'


def config_literal(kind: str, hint) -> str:
    value = CONFIG_KINDS[kind]
    return wrong_type(hint) if value is None else value


# ---- the cases ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    command: str  # the words of the command
    target: str  # the flag, positional or config key
    kind: str
    value: str  # the value (KINDS) or the TOML literal (config keys)
    via: str = "argv"  # argv | --set | --position-option | sweep
    slow: bool = False  # the tail: every kind of every target (the default part: a rotating few)

    @property
    def id(self) -> str:
        return f"{self.command}|{self.via}|{self.target}|{self.kind}".replace(" ", "-")


# Commands whose accepted values run a real harness or training loop for seconds: a larger CPU bound, and
# one kind per target in the default part.
HEAVY = {"lm-eval": 60, "compare": 20}


def default_kinds(index: int, command: str, names: list[str]) -> set[str]:
    """The kinds of the ``index``-th target run by default: a huge int (unbounded work is the worst
    defect) and one other in rotation (none for a heavy command), so the default part covers every
    target and every kind; the slow tail runs the rest."""
    if command in HEAVY:
        return {names[index % len(names)]}
    return {"huge-int", names[index % len(names)]}


def build_cases() -> list[Case]:
    targets = []  # (command, target, via, {kind: value})
    for command, parser in leaf_parsers().items():
        for action in value_actions(parser):
            target = action.option_strings[-1] if action.option_strings else action.dest
            targets.append((command, target, "argv", dict(KINDS)))
    for key, hint in config_keys().items():
        for command in ("train", "extend"):
            targets.append((command, key, "--set", {k: config_literal(k, hint) for k in CONFIG_KINDS}))
    for key, hint in encoding_keys("rope").items():
        targets.append(("eval", key, "--position-option", {k: config_literal(k, hint) for k in CONFIG_KINDS}))
    for key, hint in sweep_keys().items():
        targets.append(("compare", key, "sweep", {k: config_literal(k, hint) for k in CONFIG_KINDS}))
    cases = []
    for index, (command, target, via, values) in enumerate(targets):
        chosen = default_kinds(index, command, list(values))
        cases += [
            Case(command, target, kind, value, via, slow=kind not in chosen) for kind, value in values.items()
        ]
    return cases


CASES = build_cases()

# Defects in files this battery's owner did not own were marked here as strict xfails, with the fix, until
# their owners mended them; none is left. A new one goes here the same way: "<case id>": "<defect and fix>".
XFAIL: dict[str, str] = {}


def params():
    for case in CASES:
        reason = XFAIL.get(case.id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        if case.slow:
            marks.append(pytest.mark.slow)
        yield pytest.param(case, id=case.id, marks=marks)


# ---- running one case --------------------------------------------------------------------------------


# json.dumps writes a non-finite float as a bare NaN / Infinity / -Infinity token
NONFINITE = re.compile(r"(?<![\w\"])(NaN|-?Infinity)(?![\w\"])")
ROOTS = ("run", "syn", "data", "corpus", "hf", "tasks", "sweep", "cmp-run")


_DIGESTS: dict[tuple, str] = {}


def digests(roots) -> dict[Path, str]:
    """sha256 of every file under ``roots``; a file whose inode, size and mtime are those of an earlier
    call is not read again (every write, atomic or in place, changes one of them)."""
    found = {}
    for root in map(Path, roots):
        for path in [root] if root.is_file() else root.rglob("*"):
            st = path.lstat()
            if not path.is_file():
                continue
            key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _DIGESTS:
                _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            found[path] = _DIGESTS[key]
    return found


def argv_for(case: Case, w: dict, case_dir: Path) -> list[str]:
    bases = _bases(w, case_dir)
    base = bases[case.command]
    words = len(case.command.split())
    fill = {"abs": str(case_dir / "abs")}
    if case.via == "argv":
        parser = leaf_parsers()[case.command]
        action = next(a for a in value_actions(parser) if case.target in (a.option_strings or [a.dest]))
        return with_value(base, words, action, case.value.format(**fill))
    literal = case.value.replace("{abs}", fill["abs"])
    if case.via == "--set":
        return [*base, "--set", f"{case.target}={literal}"]
    if case.via == "--position-option":
        return [*base, "--position-option", f"{case.target}={literal}"]
    sweep = case_dir / "sweep.toml"  # a sweep file with the one key broken
    text = sweep_text(w["data"], w["cmp-run"], case.target, literal)
    sweep.write_bytes(text.encode("utf-8", "surrogateescape"))  # non-UTF-8 bytes as they are
    preset = next(a for a in leaf_parsers()["compare"]._actions if a.dest == "preset")
    return with_value(base, words, preset, str(sweep))


@pytest.fixture(scope="module")
def cheap_resolution():
    """bench --resolution-only's table computed once (a second of float arithmetic per call otherwise)."""
    import extrapos.bench.resolution as diagnostics

    table = diagnostics.position_resolution()
    original = diagnostics.position_resolution
    diagnostics.position_resolution = lambda *a, **k: table
    yield
    diagnostics.position_resolution = original


def test_every_base_runs(world, cheap_resolution, tmp_path, monkeypatch, capsys):
    """The base command lines themselves succeed (a case tests its one value, not a broken base), and
    leave the fixtures as they found them."""
    pytest.importorskip("lm_eval")
    roots = [world[k] for k in ROOTS]
    for command in leaf_parsers():
        case_dir = tmp_path / command.replace(" ", "-")
        (case_dir / "work").mkdir(parents=True)
        monkeypatch.chdir(case_dir / "work")
        before = digests(roots)
        argv = _bases(world, case_dir)[command]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"{argv}: {err}"
        after = digests(roots)
        assert all(after.get(p) == d for p, d in before.items()), command
        for path in set(after) - set(before):
            path.unlink()


@pytest.fixture(scope="module")
def one_parser():
    """``cli.main`` parses with the parser built once (argparse keeps no state between parses); building
    it is most of a refused case's time."""
    import extrapos.cli as cli

    leaf_parsers()
    original = cli.build_parser
    cli.build_parser = lambda: ROOT_PARSER[0]
    yield
    cli.build_parser = original


@pytest.mark.parametrize("case", list(params()))
def test_malformed_value_holds_the_contract(case, world, cheap_resolution, one_parser, tmp_path, monkeypatch):
    if case.command == "lm-eval":
        pytest.importorskip("lm_eval")
    import torch

    torch.set_num_threads(1)
    case_dir = tmp_path
    (case_dir / "work").mkdir()
    monkeypatch.chdir(case_dir / "work")  # ../x and bare words land in the case's own directory
    argv = argv_for(case, world, case_dir)
    roots = [world[k] for k in ROOTS]
    before = digests(roots)
    # the streams of a real terminal: stdout strict UTF-8, stderr with backslashreplace (Python's own)
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    limit = HEAVY.get(case.command, CPU_S)
    torch.set_grad_enabled(True)  # as a fresh process starts, whatever an interrupted case left behind
    try:
        with (
            bounded(cpu_s=limit, wall_s=WALL_FACTOR * limit),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    except CaseTimeout as e:
        pytest.fail(f"unbounded: {e}: extrapos {' '.join(map(repr, argv))}")
    stdout.flush()
    stderr.flush()
    out, err = (s.buffer.getvalue().decode("utf-8", "backslashreplace") for s in (stdout, stderr))
    shown = (
        f"extrapos {' '.join(map(repr, argv))}\nexit {code}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-800:]}"
    )
    assert code in (0, 2), shown
    assert "Traceback" not in out + err, shown
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(PREFIX), shown
    after = digests(roots)
    changed = [str(p) for p, d in before.items() if after.get(p) != d]
    assert not changed, f"{shown}\nchanged or removed: {changed}"
    added = set(after) - set(before)
    nonfinite = [
        str(p) for p in added if p.suffix == ".json" and NONFINITE.search(p.read_text("utf-8", "replace"))
    ]
    assert not nonfinite, f"{shown}\na result saved with a NaN or infinite number: {nonfinite}"
    for path in added:  # what an accepted case added (a result): the next starts clean
        path.unlink()


def test_every_command_has_a_base(world, tmp_path):
    """A new command without a base command line fails here; the count of cases is printed."""
    bases = _bases(world, tmp_path)
    leaves = leaf_parsers()
    missing = sorted(set(leaves) - set(bases))
    assert not missing, f"commands without a base command line in _bases: {missing}"
    by_command = Counter(c.command for c in CASES)
    for command, parser in leaves.items():
        assert by_command[command] >= len(value_actions(parser)) * len(KINDS)
    for key in config_keys():
        assert {c.kind for c in CASES if c.via == "--set" and c.target == key} == set(CONFIG_KINDS)
    default = [c for c in CASES if not c.slow]
    for command in leaves:  # the default part covers every command, every target and every kind
        assert any(c.command == command for c in default) or not value_actions(leaves[command])
    assert {(c.command, c.via, c.target) for c in default} == {(c.command, c.via, c.target) for c in CASES}
    assert {c.kind for c in default} == {c.kind for c in CASES}
    print(
        f"battery: {len(CASES)} cases ({len(default)} by default, the rest marked slow); "
        f"by command: {dict(sorted(by_command.items()))}"
    )
