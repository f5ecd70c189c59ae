"""Saved run configs stay byte-identical when fields are added: `compare` and `extend` compare a run's
config.toml as text, so a new default written into every config would orphan every existing run."""

from extrapos.config import load_config

# `extrapos train --config cpu/tiny` wrote exactly this before the fields of 2026-11 were added
CPU_TINY_BEFORE = '[model]\nflavour = "gpt2"\nn_layers = 2\nd_model = 64\nn_heads = 4\nvocab_size = 8192\ndropout = 0.0\ntie_embeddings = true\ntrain_length = 64\nnorm_eps = 1e-05\ninit_std = 0.02\n\n[model.positions]\nname = "rope"\n\n[data]\ncorpus = "sotu"\ntokenizer = "bpe:8192"\nmin_doc_tokens = 0\nsplit_fractions = [\n    0.9,\n    0.05,\n    0.05,\n]\ntext_field = "text"\npacked = false\nsampler = "contiguous"\nalpha = 0.25\n\n[train]\nbatch_size = 8\nsteps = 60\nlr = 0.003\nend_lr = 0.0003\nwarmup = 0.1\nschedule = "cosine"\nweight_decay = 0.1\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-08\ngrad_clip = 1.0\nprecision = "fp32"\ncompile = false\nseed = 0\ndevice = "auto"\nlog_every = 10\neval_every = 0\neval_batches = 16\ncheckpoint_every = 0\nkeep_checkpoints = 2\ntensorboard = false\n'


def test_a_preset_config_is_written_as_before_new_fields_existed():
    assert load_config("cpu/tiny").to_toml() == CPU_TINY_BEFORE


def test_a_non_default_new_field_is_written():
    assert "objective" not in CPU_TINY_BEFORE
    assert 'parallel = "fsdp"' in load_config("cpu/tiny", ["train.parallel=fsdp"]).to_toml()
