"""`extrapos import` of malformed Hugging Face directories (issue 24): exit status 2, one sentence naming
the key or the file, no traceback, the source directory's files unchanged, nothing left where the run
would have gone (no run directory, no temporary directory), and never a deleted temporary path named.

The model directory is a one-layer Llama written by hand (config.json, model.safetensors and a small
BPE tokenizer), so these tests need neither transformers nor a network. Most cases run in-process
through ``main([...])``; two run as a real ``python -m extrapos`` child through the harness.
"""

from __future__ import annotations

import errno
import json
import shutil
import struct
import subprocess

import pytest
import torch
from harness import assert_one_sentence_error, assert_unchanged, assert_user_error, snapshot

from extrapos.cli import main
from tests.integrations.hf_helpers import write_tokenizer

D, HIDDEN, VOCAB = 16, 24, 320
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": D,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": HIDDEN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
# the same sizes as a GPT-NeoX config: its keys are checked before any weight is read
NEOX = {
    "model_type": "gpt_neox",
    "hidden_size": D,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": HIDDEN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 32,
    "layer_norm_eps": 1e-5,
    "rotary_pct": 0.5,
}


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    layer = "model.layers.0"
    return {
        "model.embed_tokens.weight": w(VOCAB, D),
        **{f"{layer}.self_attn.{p}_proj.weight": w(D, D) for p in "qkvo"},
        f"{layer}.mlp.gate_proj.weight": w(HIDDEN, D),
        f"{layer}.mlp.up_proj.weight": w(HIDDEN, D),
        f"{layer}.mlp.down_proj.weight": w(D, HIDDEN),
        f"{layer}.input_layernorm.weight": torch.ones(D),
        f"{layer}.post_attention_layernorm.weight": torch.ones(D),
        "model.norm.weight": torch.ones(D),
    }


def _save(tensors, path):
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid tiny Llama directory, written once; each test works on a copy."""
    path = tmp_path_factory.mktemp("hf") / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    _save(_tensors(), path / "model.safetensors")
    write_tokenizer(path)
    return path


@pytest.fixture
def model(base, scratch):
    path = scratch / "llama"
    shutil.copytree(base, path)
    return path


def _import(model, out, *extra, capsys) -> subprocess.CompletedProcess:
    code = main(["import", str(model), "--out", str(out), *map(str, extra)])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["extrapos", "import"], code, captured.out, captured.err)


def _refused(model, scratch, capsys, *fragments, extra=()) -> str:
    """Import ``model`` to scratch/run; assert the contract and return the sentence."""
    out = scratch / "run"
    before = snapshot(model)
    sentence = assert_one_sentence_error(_import(model, out, *extra, capsys=capsys), *fragments)
    assert_unchanged(before)
    assert not out.exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".tmp")] == []
    assert ".tmp-" not in sentence  # never a path that no longer exists
    return sentence


def test_the_valid_directory_imports(model, scratch, capsys):
    """The baseline every case below breaks in one place."""
    result = _import(model, scratch / "run", capsys=capsys)
    assert result.returncode == 0, result.stderr
    assert (scratch / "run" / "config.toml").is_file() and (scratch / "run" / "source.json").is_file()
    from extrapos.run.directory import load_run

    run = load_run(scratch / "run")
    tokens = torch.randint(0, 300, (1, 8))
    logits = run.model(tokens, torch.arange(8).unsqueeze(0))
    assert torch.isfinite(logits).all()


# ---- config.json ------------------------------------------------------------------------------------


def _llama(**changes):
    cfg = {**CONFIG, **changes}
    return {k: v for k, v in cfg.items() if v is not ...}  # ... deletes a key


BAD_CONFIGS = [
    ("null", "null", ["config.json", "null"]),
    ("a list", "[1, 2]", ["config.json", "a list"]),
    ("invalid JSON", '{"model_type": "llama",', ["config.json", "not valid JSON"]),
    ("no hidden_size", _llama(hidden_size=...), ["hidden_size"]),
    ("no max_position_embeddings", _llama(max_position_embeddings=...), ["max_position_embeddings"]),
    ("heads 0", _llama(num_attention_heads=0), ["num_attention_heads", "positive integer"]),
    ("heads four", _llama(num_attention_heads="four"), ["num_attention_heads", '"four"']),
    ("heads 2.5", _llama(num_attention_heads=2.5), ["num_attention_heads"]),
    ("heads not dividing", _llama(num_attention_heads=3), ["not divisible"]),
    ("hidden_act a list", _llama(hidden_act=["silu"]), ["hidden_act", "a string"]),
    ("rms_norm_eps x", _llama(rms_norm_eps="x"), ["rms_norm_eps", "positive number"]),
    ("rms_norm_eps -1", _llama(rms_norm_eps=-1), ["rms_norm_eps", "positive number"]),
    ("layer_norm_eps x", {**NEOX, "layer_norm_eps": "x"}, ["layer_norm_eps"]),
    ("layer_norm_eps -1", {**NEOX, "layer_norm_eps": -1}, ["layer_norm_eps", "positive number"]),
    ("rotary_pct 2", {**NEOX, "rotary_pct": 2}, ["rotary_pct", "(0, 1]"]),
    ("rope_theta 0", _llama(rope_theta=0), ["rope_theta", "positive number"]),
    ("rope_theta -1", _llama(rope_theta=-1), ["rope_theta", "positive number"]),
    ("rope_theta NaN", _llama(rope_theta=float("nan")), ["rope_theta", "nan"]),
    ("rope_scaling a string", _llama(rope_scaling="linear"), ["rope_scaling", "an object"]),
    ("rope_scaling no factor", _llama(rope_scaling={"rope_type": "linear"}), ["rope_scaling", "factor"]),
    ("rope_scaling factor 0", _llama(rope_scaling={"type": "linear", "factor": 0}), ["rope_scaling.factor"]),
    (
        "llama3 without low_freq_factor",
        _llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}),
        ["low_freq_factor"],
    ),
    (
        "longrope factors not a list",
        _llama(rope_scaling={"rope_type": "longrope", "long_factor": 3, "short_factor": [1.0] * 4}),
        ["rope_scaling.long_factor"],
    ),
    ("rope_type a number", _llama(rope_scaling={"rope_type": 3, "factor": 2.0}), ["rope_type"]),
    # transformers 5 reads rope_scaling in place of rope_parameters: bounded, a conflict refused
    (
        "rope_scaling factor 1e30 beside rope_parameters",
        _llama(
            rope_parameters={"rope_type": "default"}, rope_scaling={"rope_type": "linear", "factor": 1e30}
        ),
        ["rope_scaling.factor"],
    ),
    (
        "rope_scaling against rope_parameters",
        _llama(
            rope_parameters={"rope_type": "linear", "factor": 2.0},
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        ),
        ["rope_parameters.factor", "rope_scaling"],
    ),
    ("model_type gpt2, llama fields", _llama(model_type="gpt2"), ["n_embd", "model_type"]),
    (
        "model_type bloom, llama fields",
        _llama(model_type="bloom", hidden_size=...),
        ["hidden_size or n_embed"],
    ),
    ("model_type a list", _llama(model_type=["llama"]), ["model_type"]),
    ("tie_word_embeddings a string", _llama(tie_word_embeddings="false"), ["tie_word_embeddings"]),
    ("no_rope_layers not flags", _llama(model_type="smollm3", no_rope_layers="1010"), ["no_rope_layers"]),
    # a context no model has: refused by key, before any RoPE table or memory estimate is sized for it
    ("max_position_embeddings 10^12", _llama(max_position_embeddings=10**12), ["max_position_embeddings"]),
    ("max_position_embeddings 1e30", _llama(max_position_embeddings=1e30), ["max_position_embeddings"]),
    (
        "original_max_position_embeddings 10^13",
        _llama(rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10**13}),
        ["rope_scaling.original_max_position_embeddings"],
    ),
    ("sliding_window 0", _llama(model_type="mistral", sliding_window=0), ["sliding_window", "positive"]),
    (
        "max_window_layers -1",
        _llama(model_type="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=-1),
        ["max_window_layers", "non-negative integer"],
    ),
    (
        "layer_types too short",
        _llama(model_type="qwen2", use_sliding_window=True, sliding_window=8, layer_types=[]),
        ["layer_types", "a list of 1 layer types"],
    ),
    (
        "layer_types chunked",
        _llama(
            model_type="qwen2", use_sliding_window=True, sliding_window=8, layer_types=["chunked_attention"]
        ),
        ["layer_types", "'chunked_attention'", "full_attention and sliding_attention"],
    ),
]


@pytest.mark.parametrize("config,fragments", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_malformed_config_is_named_by_key(model, scratch, capsys, config, fragments):
    text = config if isinstance(config, str) else json.dumps(config)
    (model / "config.json").write_text(text)
    _refused(model, scratch, capsys, *fragments)


def test_config_that_is_not_utf8(model, scratch, capsys):
    (model / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    _refused(model, scratch, capsys, "config.json", "UTF-8")


@pytest.mark.parametrize("length", ["0", "-3"])
def test_context_length_must_be_positive(model, scratch, capsys, length):
    """Not silently replaced by the model's own limit."""
    _refused(model, scratch, capsys, "context length", extra=["--context-length", length])


@pytest.mark.parametrize("length", ["100000000000", str(2**24 + 1)])
def test_context_length_must_be_bounded(model, scratch, capsys, length):
    """A typo of a few zeros is refused in one sentence, not accepted as a context nothing can hold."""
    _refused(model, scratch, capsys, "context length", "--context-length", extra=["--context-length", length])


@pytest.mark.parametrize(
    "window,extra",
    [(32, []), (None, []), (16, []), (16, ["--context-length", "16"])],
    ids=["= context", "none", "shorter", "cut"],
)
def test_mistral_window_imports_and_is_kept(model, scratch, capsys, window, extra):
    """A sliding window of any length imports, at the model's own context unless told otherwise, and the
    run keeps it (issue 37: it was once dropped or refused)."""
    (model / "config.json").write_text(json.dumps(_llama(model_type="mistral", sliding_window=window)))
    result = _import(model, scratch / "run", *extra, capsys=capsys)
    assert result.returncode == 0, result.stderr
    record = json.loads((scratch / "run" / "source.json").read_text())
    assert record["train_length"] == (int(extra[1]) if extra else CONFIG["max_position_embeddings"])
    from extrapos.run.config import load_run_config

    assert load_run_config(scratch / "run").model.sliding_window == window


@pytest.mark.parametrize(
    "changes,window",
    [
        (dict(use_sliding_window=True, sliding_window=8), None),  # max_window_layers 28 covers the 1 layer
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), None),
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=0), 8),
        (dict(use_sliding_window=False, sliding_window=8, max_window_layers=0), None),
        (dict(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention"]), 8),
    ],
    ids=["default layers", "all full", "all sliding", "switched off", "layer_types"],
)
def test_qwen2_window_follows_its_layers(model, scratch, capsys, changes, window):
    """Qwen2's window is where Hugging Face applies it: from max_window_layers on, or as layer_types say."""
    qwen2 = _llama(model_type="qwen2", **changes)
    (model / "config.json").write_text(json.dumps(qwen2))
    from safetensors.torch import load_file

    tensors = load_file(str(model / "model.safetensors"))  # Qwen2's block has Q/K/V biases
    for p in "qkv":
        tensors[f"model.layers.0.self_attn.{p}_proj.bias"] = torch.zeros(D)
    _save(tensors, model / "model.safetensors")
    result = _import(model, scratch / "run", capsys=capsys)
    assert result.returncode == 0, result.stderr
    from extrapos.run.config import load_run_config

    assert load_run_config(scratch / "run").model.sliding_window == window


# ---- the shard index ----------------------------------------------------------------------------------

BAD_INDEXES = [
    ("invalid JSON", '{"weight_map": ', ["model.safetensors.index.json", "not valid JSON"]),
    ("a list", '["model.safetensors"]', ["model.safetensors.index.json", "weight_map"]),
    ("no weight_map", '{"metadata": {}}', ["model.safetensors.index.json", "weight_map"]),
    ("weight_map a list", '{"weight_map": ["model.safetensors"]}', ["weight_map"]),
    ("a path for a shard", '{"weight_map": {"model.norm.weight": "../x.safetensors"}}', ["../x.safetensors"]),
    ("a number for a shard", '{"weight_map": {"model.norm.weight": 3}}', ["not a shard file name"]),
]


@pytest.mark.parametrize("text,fragments", [c[1:] for c in BAD_INDEXES], ids=[c[0] for c in BAD_INDEXES])
def test_malformed_index_is_named(model, scratch, capsys, text, fragments):
    (model / "model.safetensors.index.json").write_text(text)
    _refused(model, scratch, capsys, *fragments)


# ---- the safetensors file -----------------------------------------------------------------------------


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _header_length_too_large(path):
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(data) * 10) + data[8:])


def _header_not_json(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[:8] + b"\x00" * n + data[8 + n :])


BAD_SHARDS = {
    "truncated": _truncate,
    "empty": lambda p: p.write_bytes(b""),
    "eight bytes": lambda p: p.write_bytes(b"\x08" + b"\x00" * 7),
    "header length past the end": _header_length_too_large,
    "header not JSON": _header_not_json,
}


@pytest.mark.parametrize("damage", list(BAD_SHARDS.values()), ids=list(BAD_SHARDS))
def test_damaged_safetensors_is_named(model, scratch, capsys, damage):
    damage(model / "model.safetensors")
    _refused(model, scratch, capsys, "model.safetensors", "not a readable safetensors file")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(model, scratch, capsys, value):
    """The import would succeed and every loss of the run would be NaN (issue 24, item 12)."""
    tensors = _tensors()
    tensors["model.layers.0.self_attn.q_proj.weight"][3, 5] = value
    _save(tensors, model / "model.safetensors")
    _refused(model, scratch, capsys, "model.layers.0.self_attn.q_proj.weight", "NaN")


@pytest.mark.parametrize("dtype,name", [(torch.int64, "I64"), (torch.int8, "I8"), (torch.bool, "BOOL")])
def test_integer_weights_are_refused(model, scratch, capsys, dtype, name):
    """Cast to float they would be meaningless (and a later eval overflowed converting them)."""
    tensors = _tensors()
    tensors["model.embed_tokens.weight"] = (tensors["model.embed_tokens.weight"] * 100).to(dtype)
    _save(tensors, model / "model.safetensors")
    _refused(model, scratch, capsys, "model.embed_tokens.weight", name, "floating-point")


@pytest.mark.parametrize(
    "changes",
    [{"hidden_size": 2**30}, {"vocab_size": 10**12}, {"num_hidden_layers": 10**7}, {"intermediate_size": 64}],
    ids=["hidden_size 2^30", "vocab_size 10^12", "layers 10^7", "intermediate_size larger"],
)
def test_config_larger_than_its_weights_is_refused_before_allocating(model, scratch, capsys, changes):
    """A huge size in config.json is compared with the shards' headers, never allocated (it would
    exhaust memory before the shapes were compared)."""
    (model / "config.json").write_text(json.dumps(_llama(**changes)))
    _refused(model, scratch, capsys, "config.json describes a model of", "weights disagree")


def _gpt2(path, n_positions=32):
    """A one-layer GPT-2 directory (Conv1D weights stored (in, out)) beside the Llama ones."""
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    h = "transformer.h.0"
    tensors = {
        "transformer.wte.weight": w(VOCAB, D),
        "transformer.wpe.weight": w(32, D),
        f"{h}.attn.c_attn.weight": w(D, 3 * D),
        f"{h}.attn.c_attn.bias": w(3 * D),
        f"{h}.attn.c_proj.weight": w(D, D),
        f"{h}.attn.c_proj.bias": w(D),
        f"{h}.mlp.c_fc.weight": w(D, 4 * D),
        f"{h}.mlp.c_fc.bias": w(4 * D),
        f"{h}.mlp.c_proj.weight": w(4 * D, D),
        f"{h}.mlp.c_proj.bias": w(D),
        **{f"{h}.{n}.weight": torch.ones(D) for n in ("ln_1", "ln_2")},
        **{f"{h}.{n}.bias": torch.zeros(D) for n in ("ln_1", "ln_2")},
        "transformer.ln_f.weight": torch.ones(D),
        "transformer.ln_f.bias": torch.zeros(D),
    }
    _save(tensors, path / "model.safetensors")
    config = {"model_type": "gpt2", "n_embd": D, "n_layer": 1, "n_head": 2, "n_positions": n_positions}
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": VOCAB}))


def test_gpt2_position_table_larger_than_its_weights(model, scratch, capsys):
    """n_positions 10^7 would allocate a 640 MB table the shards do not hold: refused from the headers;
    10^10 (a 640 GB table) is past any context length and refused by key before that."""
    _gpt2(model)
    assert _import(model, scratch / "ok", capsys=capsys).returncode == 0  # the directory itself is valid
    _gpt2(model, n_positions=10**7)
    _refused(model, scratch, capsys, "config.json describes a model of", "weights disagree")
    _gpt2(model, n_positions=10**10)
    _refused(model, scratch, capsys, "config.json's n_positions", "16,777,216")


def test_untied_config_for_tied_weights_is_refused(model, scratch, capsys):
    (model / "config.json").write_text(json.dumps(_llama(tie_word_embeddings=False)))
    _refused(model, scratch, capsys, "weights disagree")


# ---- the tokenizer and the output ---------------------------------------------------------------------


def test_damaged_tokenizer_names_the_users_file(model, scratch, capsys):
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    sentence = _refused(model, scratch, capsys, "tokenizer.json")
    assert str(model / "tokenizer.json") in sentence


def test_write_failure_names_no_temporary_path(model, scratch, capsys, monkeypatch):
    """A full disk while the checkpoint is written: the sentence names the run, not the deleted tmp."""
    import extrapos.run.checkpoint

    def full(directory, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "model.safetensors"))

    monkeypatch.setattr(extrapos.run.checkpoint, "save_checkpoint", full)
    sentence = _refused(model, scratch, capsys, "No space left on device", str(scratch / "run"))
    assert "model.safetensors" not in sentence


# ---- the same contract through a real process ---------------------------------------------------------


def test_null_config_in_a_child_process(model, scratch, cache):
    (model / "config.json").write_text("null")
    assert_user_error(
        ["import", model, "--out", scratch / "run"], cache=cache, watch=[model], fragments=["null"]
    )
    assert not (scratch / "run").exists()


def test_nan_weights_in_a_child_process(model, scratch, cache):
    tensors = _tensors()
    tensors["model.norm.weight"][0] = float("nan")
    _save(tensors, model / "model.safetensors")
    assert_user_error(
        ["import", model, "--out", scratch / "run"],
        cache=cache,
        watch=[model],
        fragments=["model.norm.weight", "NaN"],
    )
    assert not (scratch / "run").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".tmp")] == []


def test_import_under_a_file_size_limit(model, scratch, cache):
    """The checkpoint cannot be written: one sentence naming the run, nothing left, import again works."""
    limit = (model / "tokenizer.json").stat().st_size + 4096
    assert (model / "model.safetensors").stat().st_size > 2 * limit  # the weights hit the limit
    sentence = assert_user_error(
        ["import", model, "--out", scratch / "run"],
        cache=cache,
        watch=[model],
        fragments=[str(scratch / "run"), "File too large", "import again"],
        fsize_limit=limit,
    )
    assert ".tmp-" not in sentence and "resume" not in sentence
    assert not (scratch / "run").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".tmp")] == []
    from harness import run

    assert run(["import", model, "--out", scratch / "run"], cache=cache).returncode == 0


def test_export_under_a_file_size_limit(model, scratch, cache, capsys):
    """`export` onto a file-size limit (issue 24's traceback list): one sentence, nothing left behind."""
    assert _import(model, scratch / "run", capsys=capsys).returncode == 0
    sentence = assert_user_error(
        ["export", scratch / "run", "--out", scratch / "exported"],
        cache=cache,
        watch=[scratch / "run"],
        fragments=[str(scratch / "exported"), "File too large", "export again"],
        fsize_limit=8192,
    )
    assert ".tmp-" not in sentence
    assert not (scratch / "exported").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".tmp")] == []
