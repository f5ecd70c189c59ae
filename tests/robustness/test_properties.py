"""Property-based input testing (issue 48, part 3): any value of any input gives either a valid object or
one sentence (a ``UserError`` of one line, exit 2 at the command line), never a traceback (any other
exception) and never a silent default (a value accepted and then replaced by another).

Hypothesis draws the values: arbitrary JSON/TOML-like values (ints up to 10**400, floats with NaN and
infinities, strings with lone surrogates, which is how bytes that are not UTF-8 reach Python, lists,
tables, None, booleans) for every option of every registered encoding; arbitrary ``--set KEY=VALUE``
strings; valid ``config.json`` files of the importer with one to three keys changed or removed; arbitrary
bytes and mutated SQuAD / HotpotQA JSON for the RULER QA readers; arbitrary bytes for ``--prompt-file``.

The runs are deterministic (``derandomize=True``: the same examples on every machine, so CI is stable)
and bounded (``max_examples``, ``deadline=None`` so a loaded machine does not fail them). For a longer
search set ``EXTRAPOS_HYPOTHESIS=long`` (10x the examples, random rather than derandomized), e.g.
``EXTRAPOS_HYPOTHESIS=long .venv/bin/python -m pytest tests/robustness/test_properties.py``.
docs/robustness.md describes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from harness import PREFIX
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from test_import_inputs import CONFIG, NEOX

from extrapos.cli import main
from extrapos.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LONG = os.environ.get("EXTRAPOS_HYPOTHESIS") == "long"


def _settings(examples: int) -> settings:
    """``examples`` drawn the same way on every run (10x, random, with EXTRAPOS_HYPOTHESIS=long)."""
    return settings(
        max_examples=examples * 10 if LONG else examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def _one_sentence(error: UserError) -> str:
    """The error's message, asserted to be one non-empty line (what the CLI prints after 'error:')."""
    event("refused in one sentence")  # --hypothesis-show-statistics shows the share of each outcome
    message = str(error)
    assert message.strip() and "\n" not in message.strip(), repr(message)
    return message


# ---- strategies -------------------------------------------------------------------------------------

# ints of every size: small, at the int64 edges, and far past any float (10**400)
INTS = st.one_of(
    st.integers(-(10**6), 10**6),
    st.integers(),
    st.sampled_from([0, 1, -1, 2**24, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), 10**30, 10**400]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10.0, 10.0),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320, 1e308, 0.5, 1.0, 2.0, 4.0]),
)
# text with lone surrogates (os.fsdecode's form of bytes that are not UTF-8), NUL and line breaks
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.sampled_from(["", " ", "\udcff", "a\udc80b", "\x00", "line\nbreak", "rope", "yarn", "linear", "none"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)


# ---- encoding options -------------------------------------------------------------------------------


def _encodings() -> list[str]:
    from extrapos.positions.registry import names

    return names()


def _fields(name: str) -> list[str]:
    from extrapos.positions.registry import spec

    return [f.name for f in dataclasses.fields(spec(name).cls.Options)]


def _assert_valid_options(name: str, given_options: dict[str, Any], built: Any) -> None:
    """A built Options keeps every given value (ints widened to floats where a float is meant) and
    satisfies its own declared bounds and choices."""
    from extrapos.bounds import choices
    from extrapos.schema import check

    hints = typing.get_type_hints(type(built))
    for key, value in given_options.items():
        # the same value, of the annotated type: never replaced by a default
        assert getattr(built, key) == check(hints[key], value, key), (key, value, getattr(built, key))
    for key, bound in built.BOUNDS.items():
        value = getattr(built, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert bound.holds(value), (key, value, bound.rule)
    for key, allowed in choices(type(built)).items():
        assert getattr(built, key) is None or getattr(built, key) in allowed


def _mostly(likely: st.SearchStrategy, other: st.SearchStrategy, odds: int = 3) -> st.SearchStrategy:
    """``likely`` ``odds`` times out of ``odds + 1``, else ``other``: mostly well-formed values, so that
    both outcomes (a valid object and a refusal) are drawn often."""
    return st.integers(0, odds).flatmap(lambda i: other if i == 0 else likely)


def _near(bound: Any, whole: bool) -> st.SearchStrategy:
    """Numbers inside a declared bound, on its edges and just outside them."""
    low = -1e6 if bound is None or bound.low is None else bound.low
    high = (low + 1e6) if bound is None or bound.high is None else bound.high
    if whole:
        inside: st.SearchStrategy = st.integers(math.ceil(low), math.floor(min(high, low + 10**6)))
        edges = [math.ceil(low) - 1, math.floor(high) + 1]
    else:
        inside = st.floats(low, high)
        edges = [low - 1, high + 1, low * 0.999, high * 1.001]
    return st.one_of(inside, st.sampled_from([low, high, *edges]).map(int if whole else float))


def _option_values(name: str, key: str) -> st.SearchStrategy:
    """Values of the option's own kind (its choices, its bound, its type) mostly, any value otherwise."""
    from extrapos.bounds import choices
    from extrapos.positions.registry import spec

    options = spec(name).cls.Options
    hint = typing.get_type_hints(options)[key]
    kinds = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
    if key in choices(options):
        typed: st.SearchStrategy = st.sampled_from(list(choices(options)[key]))
    elif bool in kinds:
        typed = st.booleans()
    elif int in kinds or float in kinds:
        typed = _near(options.BOUNDS.get(key), whole=float not in kinds)
    elif any(typing.get_origin(k) is list for k in kinds):
        typed = st.lists(st.floats(0.01, 100.0), max_size=6)
    else:
        typed = VALUES
    return _mostly(typed, VALUES)


@st.composite
def _encoding_options(draw) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(_encodings()))
    if not _fields(name):
        return name, draw(st.dictionaries(st.text(max_size=6), VALUES, min_size=1, max_size=1))
    keys = draw(st.lists(st.sampled_from(_fields(name)), min_size=1, max_size=3, unique=True))
    return name, {key: draw(_option_values(name, key)) for key in keys}


@_settings(400)
@given(_encoding_options())
@example(("rope", {"scaling": "yarn", "factor": 4.0, "beta_fast": 0}))
@example(("rope", {"attention_factor": math.nan}))
@example(("rope", {"base": 10**400}))
@example(("rope", {"scaling": "\udcff"}))
@example(("nope", {"\n": None}))  # found by this test: an unknown option's name printed as is, two lines
def test_every_option_value_builds_a_valid_options_or_one_sentence(case):
    """``build_options`` (what [model.positions], --set model.positions.* and the library all go through):
    any value of any option of any registered encoding."""
    from extrapos.positions.registry import build_options

    name, options = case
    try:
        built = build_options(name, options)
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    _assert_valid_options(name, options, built)


@_settings(150)
@given(st.sampled_from(_encodings()), st.data())
def test_one_option_at_a_time_of_every_encoding(name, data):
    """Each option alone (the other options at their defaults), so every field is drawn often."""
    from extrapos.positions.registry import build_options

    fields = _fields(name)
    if not fields:
        return
    key = data.draw(st.sampled_from(fields))
    value = data.draw(_option_values(name, key))
    try:
        built = build_options(name, {key: value})
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    _assert_valid_options(name, {key: value}, built)


# ---- --set KEY=VALUE ----------------------------------------------------------------------------------


def _config_keys() -> list[str]:
    from extrapos.model import ModelConfig
    from extrapos.run.config import DataConfig, TrainConfig

    keys = [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)] + ["model.size"]
    keys += [f"data.{f.name}" for f in dataclasses.fields(DataConfig)]
    keys += [f"train.{f.name}" for f in dataclasses.fields(TrainConfig)]
    keys += [f"model.positions.{k}" for k in ("name", "base", "scaling", "factor", "alpha", "scale")]
    keys += ["model.positions.layers", "model.positions.others", "model.positions.others.name"]
    return keys + ["train", "nosuch.key", "train.nosuch", "model.positions.name.deeper"]


def _toml_text(value: Any) -> str:
    """``value`` as a TOML value (what a user would type after '='), or as a bare word when TOML has no
    form for it (None, NaN keep their repr: the parser reads them as strings)."""
    import tomli_w

    try:
        return tomli_w.dumps({"v": value})[len("v = ") :].strip()
    except (TypeError, ValueError):
        return str(value)


SET_VALUES = st.one_of(
    TEXT, VALUES.map(_toml_text), st.sampled_from(["nan", "inf", "-inf", "1e999", "[", "{"])
)
# the words the config's string keys choose between (and some they do not)
WORDS_OF_KEYS = (
    "cosine linear constant fp32 bf16 auto ddp fsdp cpu cuda cuda:0 mps lm mlm contiguous chunk prefix full "
    "randompos pose synthetic restart continue original concatenated document within gpt2 llama encoder "
    "rope alibi nope expe cable silu gelu sotu bpe:256 cpu-tiny cpu-small none yarn all"
).split()


def _set_value(key: str) -> st.SearchStrategy:
    """The text after '=' for ``key``: mostly a value of the key's own kind, else anything."""
    from extrapos.model import ModelConfig
    from extrapos.run.config import DataConfig, TrainConfig

    section, _, name = key.partition(".")
    hints = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}.get(section)
    hint = typing.get_type_hints(hints).get(name) if hints is not None else None
    kinds = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
    if key == "model.positions.layers":  # a schedule's layers: its phrases or a list of indices
        typed: st.SearchStrategy = st.one_of(
            st.sampled_from(["all", "every 2nd", "every 4th from 1", "all but every 2nd", "every 0th"]),
            st.lists(st.integers(-2, 6), max_size=4),
        )
    elif key.startswith("model.positions."):  # an encoding's option: a number or a word mostly
        typed = st.one_of(st.sampled_from(WORDS_OF_KEYS), st.floats(-1.0, 1e5), st.integers(-2, 10**5))
    elif bool in kinds:
        typed = st.booleans()
    elif int in kinds:
        typed = st.one_of(st.integers(-2, 300), st.integers(-(2**64), 2**64))
    elif float in kinds:
        typed = st.one_of(st.floats(-0.5, 1.5), st.floats(-1e4, 1e6), FLOATS)
    elif str in kinds or section == "model":
        typed = st.one_of(st.sampled_from(WORDS_OF_KEYS), TEXT)
    elif any(typing.get_origin(k) is list for k in kinds):
        typed = st.lists(st.one_of(st.floats(0, 1), st.integers(0, 8)), max_size=4)
    else:
        typed = VALUES
    return _mostly(typed.map(_toml_text), SET_VALUES)


@st.composite
def _set_pairs(draw) -> tuple[str, str]:
    key = draw(st.sampled_from(_config_keys()))
    return key, draw(_set_value(key))


def _assert_resolved_config_round_trips(cfg: Any) -> None:
    """What is accepted can be written to config.toml and read back as the same config (a run is
    resumed from that file)."""
    from extrapos.run.config import from_dict

    again = from_dict(tomllib.loads(cfg.to_toml()))
    assert again == cfg


@_settings(250)
@given(_set_pairs())
@example(("train.steps", "1e999"))
@example(("train.lr", "nan"))
@example(("model.positions.base", "10000000000000000000000000000000"))
@example(("data.corpus", "\udcff"))
# found by this test: a key under a value (TypeError) and a list as the encoding's name (unhashable)
@example(("model.positions.name.deeper", ""))
@example(("model.positions.name", "[]"))
def test_a_set_value_gives_a_valid_config_or_one_sentence(pair):
    """``--set KEY=VALUE`` on the cpu/tiny preset (``load_config``, what train/extend/eval read): either a
    config that holds the value as given and writes itself to config.toml, or one sentence."""
    from extrapos.presets import parse_toml_value
    from extrapos.run.config import load_config

    key, text = pair
    try:
        cfg = load_config("cpu/tiny", [f"{key}={text}"])
    except UserError as e:
        _one_sentence(e)
        return
    section, _, field = key.partition(".")
    value = parse_toml_value(text)
    if section in ("train", "data", "model") and "." not in field and field not in ("size", "positions"):
        held = getattr(getattr(cfg, section), field)
        assert held == value, (key, text, held)  # as given (an int widened to a float is equal)
    elif field.startswith("positions.") and field.count(".") == 1:
        assert cfg.model.positions[field.split(".")[1]] == value, (key, text, cfg.model.positions)
    event("valid")
    _assert_resolved_config_round_trips(cfg)


@_settings(150)
@given(
    st.lists(
        _mostly(_set_pairs().map("=".join), st.text(st.characters(exclude_categories=()), max_size=30), 1),
        min_size=1,
        max_size=3,
    )
)
@example(["\n"])  # found by this test: the override's text printed as is, a message of two lines
@example(["train.steps.x=1"])
@example(["train.a\nb=1"])  # found beside them: an unknown key or section printed with its line break
@example(["a\nb.c=1"])
@example(["=1"])
@example([".=1"])
@example(["train.=1"])
@example(["model.positions=rope", "model.positions.base=2.0"])
def test_any_set_strings_give_a_valid_config_or_one_sentence(scratch_dir, texts):
    """Arbitrary ``--set`` strings, several at once, including ones with no '=' or an empty key; a refusal
    is also run through the command line (``extrapos train --set ...``): exit 2, one line, nothing made."""
    from extrapos.run.config import load_config

    try:
        cfg = load_config("cpu/tiny", texts)
    except UserError as e:
        sentence = _one_sentence(e)
        out = scratch_dir / "never-made"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["train", "--config", "cpu/tiny", "--out", str(out), *(f"--set={t}" for t in texts)])
        assert code == 2 and err.getvalue() == f"{PREFIX}{sentence}\n" and not out.exists(), err.getvalue()
        return
    event("valid")
    _assert_resolved_config_round_trips(cfg)


@_settings(150)
@given(
    _mostly(
        st.sampled_from(
            ["cpu/tiny", "cpu/tiny.toml", "cpu/../cpu/tiny", "nosuch", "nosuch.toml", "/", ".toml"]
        ),
        st.text(st.characters(exclude_categories=()), max_size=20),
        1,
    )
)
@example("a\nb")  # found beside the cases above: a preset name printed with its line break, two lines
@example("x" * 5000)  # found beside them: a name too long for the file system was an OSError (ENAMETOOLONG)
@example("\x00")
def test_any_config_name_gives_a_valid_config_or_one_sentence(spec):
    """``--config`` (a TOML path or a preset name, ``find_config``) of any text."""
    from extrapos.run.config import load_config

    try:
        cfg = load_config(spec)
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    _assert_resolved_config_round_trips(cfg)


# ---- the importer's config.json ---------------------------------------------------------------------

# the keys the adapters read, and the RoPE objects whose fields are read one by one
HF_KEYS = sorted(
    set(CONFIG)
    | set(NEOX)
    | {
        "rope_scaling",
        "rope_parameters",
        "head_dim",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "partial_rotary_factor",
        "attention_bias",
        "mlp_bias",
        "original_max_position_embeddings",
        "no_rope_layers",
    }
)
ROPE_TYPES = ["default", "linear", "dynamic", "yarn", "llama3", "longrope", "su", "ntk", ""]
ROPE_KEYS = [
    "rope_type",
    "type",
    "factor",
    "rope_theta",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "short_factor",
    "long_factor",
    "mscale",
]
ROPE_OBJECTS = st.dictionaries(
    st.sampled_from(ROPE_KEYS),
    st.one_of(st.sampled_from(ROPE_TYPES), FLOATS, INTS, st.lists(FLOATS, max_size=5), VALUES),
    max_size=5,
)
DELETE = object()
# removed, anything, a RoPE object, or a number of the kind most keys hold
HF_VALUES = st.one_of(st.just(DELETE), VALUES, ROPE_OBJECTS, st.integers(-1, 64), st.floats(-1.0, 1e5))


def _import_config(directory: Path, hf: dict[str, Any]) -> Any:
    """What ``extrapos import`` reads before any weight: config.json through its reader and the adapter
    into a ModelConfig, and the run config around it, checked as ``import_pretrained`` checks it."""
    from extrapos.integrations.hf.importer import model_options_from_hf
    from extrapos.integrations.hf.source import read_hf_config
    from extrapos.model import model_config
    from extrapos.run.config import DataConfig, RunConfig, TrainConfig, validate

    # json.dumps writes NaN and Infinity as JavaScript does, and lone surrogates as \\udcff escapes: both
    # read back by json.loads, as a hand-edited config.json may hold them
    (directory / "config.json").write_text(json.dumps(hf))
    imported = model_options_from_hf(read_hf_config(directory))
    cfg = RunConfig(model_config(**imported.model), DataConfig(tokenizer="tokenizer.json"), TrainConfig())
    validate(cfg)
    return cfg


@pytest.fixture(scope="module")
def scratch_dir(tmp_path_factory) -> Path:
    """One folder the file-reading properties write into, each example overwriting its file (a function's
    tmp_path is not renewed between Hypothesis examples)."""
    return tmp_path_factory.mktemp("properties")


@_settings(300)
@given(
    st.sampled_from([CONFIG, NEOX]),
    st.dictionaries(st.sampled_from(HF_KEYS), HF_VALUES, min_size=1, max_size=3),
)
@example(CONFIG, {"rope_scaling": {"rope_type": "linear", "factor": 1e30}})
@example(CONFIG, {"rope_theta": math.nan})
@example(CONFIG, {"max_position_embeddings": 10**400})
@example(CONFIG, {"hidden_act": "\udcff"})
def test_a_mutated_config_json_imports_a_valid_model_or_one_sentence(scratch_dir, valid, changes):
    """A valid Llama or GPT-NeoX config.json with one to three keys set to any value or removed."""
    hf = {**valid, **changes}
    hf = {k: v for k, v in hf.items() if v is not DELETE}
    try:
        run_cfg = _import_config(scratch_dir, hf)
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    _assert_resolved_config_round_trips(run_cfg)  # its config.toml reads back equal
    cfg = run_cfg.model
    # read as given, never replaced: the sizes and the base frequency the config names
    assert cfg.d_model == hf["hidden_size"] and cfg.n_layers == hf["num_hidden_layers"]
    assert cfg.n_heads == hf["num_attention_heads"] and cfg.vocab_size == hf["vocab_size"]
    if cfg.positions["name"] == "rope" and hf.get("rope_theta") is not None:  # null: HF's default, as absent
        assert cfg.positions["base"] == hf["rope_theta"]


# ---- RULER QA files -----------------------------------------------------------------------------------


def _field(value: st.SearchStrategy) -> st.SearchStrategy:
    """A field of a QA file: mostly the valid kind of value, sometimes anything."""
    return _mostly(value, VALUES, 40)


WORDS = _mostly(
    st.text("ab xy", min_size=1, max_size=8), st.text(st.characters(exclude_categories=()), max_size=8)
)
SQUAD_QA = st.fixed_dictionaries(
    {
        "question": _field(WORDS),
        "answers": _field(st.lists(_field(st.fixed_dictionaries({"text": _field(WORDS)})), min_size=1)),
    },
    optional={"is_impossible": _field(st.booleans()), "id": VALUES},
)
SQUAD = st.fixed_dictionaries(
    {
        "data": _field(
            st.lists(
                _field(
                    st.fixed_dictionaries(
                        {
                            "paragraphs": _field(
                                st.lists(
                                    _field(
                                        st.fixed_dictionaries(
                                            {
                                                "context": _field(WORDS),
                                                "qas": _field(st.lists(SQUAD_QA, min_size=1, max_size=3)),
                                            }
                                        )
                                    ),
                                    min_size=1,
                                    max_size=3,
                                )
                            )
                        }
                    )
                ),
                min_size=1,
                max_size=3,
            )
        )
    },
    optional={"version": VALUES},
)
HOTPOT = _field(
    st.lists(
        _field(
            st.fixed_dictionaries(
                {
                    "question": _field(WORDS),
                    "answer": _field(WORDS),
                    "context": _field(
                        st.lists(
                            _field(st.tuples(_field(WORDS), _field(st.lists(_field(WORDS), max_size=3)))),
                            min_size=1,
                        )
                    ),
                }
            )
        ),
        min_size=1,
        max_size=3,
    )
)


def _json_bytes(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """The file's bytes: json.dumps writes NaN as the bare token and a lone surrogate as an escape, both
    read back by json.loads, as a hand-made file may hold them."""
    return strategy.map(lambda value: json.dumps(value).encode())


def _squad_file(question: Any, answer: Any) -> bytes:
    """A SQuAD file of one paragraph and one question."""
    qa = {"question": question, "answers": [{"text": answer}]}
    return json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [qa]}]}]}).encode()


# (dataset, the file's bytes): mostly a file of the dataset's own shape, else bytes or the other's shape
QA_CASES = st.one_of(
    st.tuples(st.just("squad"), _json_bytes(SQUAD)),
    st.tuples(st.just("hotpotqa"), _json_bytes(HOTPOT)),
    st.tuples(st.just("squad"), _json_bytes(SQUAD)),
    st.tuples(st.just("hotpotqa"), _json_bytes(HOTPOT)),
    st.tuples(st.sampled_from(["squad", "hotpotqa"]), st.binary(max_size=64)),
    st.tuples(st.just("squad"), _json_bytes(HOTPOT)),
    st.tuples(st.just("hotpotqa"), _json_bytes(SQUAD)),
)


def _assert_valid_qa(qa: Any) -> None:
    """Every record names documents of the file, and every text is non-empty UTF-8 (a prompt and its
    scoring are built from them)."""
    assert qa.records
    for text in qa.docs:
        assert isinstance(text, str)
        text.encode("utf-8")
    for record in qa.records:
        assert isinstance(record.query, str) and record.query, record
        record.query.encode("utf-8")
        assert record.answers and all(isinstance(a, str) and a for a in record.answers), record
        for a in record.answers:
            a.encode("utf-8")
        assert all(0 <= i < len(qa.docs) for i in record.context + record.more)


@_settings(300)
@given(QA_CASES)
@example(("squad", b"\xff\xfe"))
@example(("squad", b'{"data": []}'))
@example(("hotpotqa", b"[]"))
# found by this test: an empty question and answer with no document was a record (every output scores),
# a null question read as the text "None", an escaped lone surrogate a prompt that cannot be written
@example(("hotpotqa", b'[{"question":"","answer":"","context":[]}]'))
@example(("squad", _squad_file(question=None, answer="a")))
@example(("squad", _squad_file(question="q", answer=" ")))
@example(("hotpotqa", b'[{"question": "q\\udcff", "answer": "a", "context": [["t", ["s"]]]}]'))
@example(("hotpotqa", b'[{"question": "q", "answer": "a", "context": [[null, ["s"]]]}]'))
@example(("hotpotqa", b'[{"question": "q", "answer": "a", "context": [["t"]]}]'))
def test_a_qa_file_reads_as_questions_or_one_sentence(scratch_dir, case):
    """``load_qa`` (``extrapos ruler --squad FILE / --hotpotqa FILE``) on any bytes, and on SQuAD- and
    HotpotQA-shaped JSON whose fields may hold any value."""
    from extrapos.data.ruler_qa import load_qa

    dataset, data = case
    path = scratch_dir / "qa.json"
    path.write_bytes(data)
    try:
        qa = load_qa(dataset, path)
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    _assert_valid_qa(qa)


# ---- prompt files --------------------------------------------------------------------------------------


@_settings(200)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.text(st.characters(exclude_categories=()), max_size=20).map(
            lambda t: t.encode("utf-8", "surrogatepass")
        ),
    )
)
@example(b"")
@example(b"\xed\xb3\xbf")  # a lone surrogate, as UTF-8 would encode it (invalid UTF-8)
@example(b"a\x00b")
def test_a_prompt_file_reads_as_its_text_or_one_sentence(scratch_dir, data):
    """``--prompt-file`` of ``extrapos generate``: the file's exact text, or one sentence."""
    from extrapos.cli.generate import read_prompt_file

    path = scratch_dir / "prompt.txt"
    path.write_bytes(data)
    try:
        text = read_prompt_file(path)
    except UserError as e:
        _one_sentence(e)
        return
    event("valid")
    assert text.encode("utf-8") == data  # exactly the file, never decoded with replacements
    assert "\x00" not in text
