"""Saved run configs stay byte-identical when fields are added: `compare` and `extend` compare a run's
config.toml as text, so a new default written into every config would orphan every existing run."""

from extrapos.run.config import load_config

# `extrapos train --config cpu/tiny` wrote exactly this before the fields of 2026-11 were added
CPU_TINY_BEFORE = (
    "[model]\n"
    'flavour = "gpt2"\n'
    "n_layers = 2\n"
    "d_model = 64\n"
    "n_heads = 4\n"
    "vocab_size = 8192\n"
    "dropout = 0.0\n"
    "tie_embeddings = true\n"
    "train_length = 64\n"
    "norm_eps = 1e-05\n"
    "init_std = 0.02\n"
    "\n"
    "[model.positions]\n"
    'name = "rope"\n'
    "\n"
    "[data]\n"
    'corpus = "sotu"\n'
    'tokenizer = "bpe:8192"\n'
    "min_doc_tokens = 0\n"
    "split_fractions = [\n"
    "    0.9,\n"
    "    0.05,\n"
    "    0.05,\n"
    "]\n"
    'text_field = "text"\n'
    "packed = false\n"
    'sampler = "contiguous"\n'
    "alpha = 0.25\n"
    "\n"
    "[train]\n"
    "batch_size = 8\n"
    "steps = 60\n"
    "lr = 0.003\n"
    "end_lr = 0.0003\n"
    "warmup = 0.1\n"
    'schedule = "cosine"\n'
    "weight_decay = 0.1\n"
    "beta1 = 0.9\n"
    "beta2 = 0.95\n"
    "eps = 1e-08\n"
    "grad_clip = 1.0\n"
    'precision = "fp32"\n'
    "compile = false\n"
    "seed = 0\n"
    'device = "auto"\n'
    "log_every = 10\n"
    "eval_every = 0\n"
    "eval_batches = 16\n"
    "checkpoint_every = 0\n"
    "keep_checkpoints = 2\n"
    "tensorboard = false\n"
)


def test_a_preset_config_is_written_as_before_new_fields_existed():
    assert load_config("cpu/tiny").to_toml() == CPU_TINY_BEFORE


def test_a_non_default_new_field_is_written():
    assert "objective" not in CPU_TINY_BEFORE
    assert 'parallel = "fsdp"' in load_config("cpu/tiny", ["train.parallel=fsdp"]).to_toml()
