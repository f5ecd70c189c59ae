"""Tiny random Hugging Face models and extrapos runs for the tests/test_hf_*.py files."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320  # the tokenizer has 300 tokens: the model's vocabulary may be larger, as in Pythia
CONTEXT = 32
TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 20,
    "Pack my box with five dozen liquor jugs! " * 20,
    "Sphinx of black quartz, judge my vow; 0123456789 " * 20,
]


def write_tokenizer(directory: Path, vocab: int = 300) -> Path:
    from extrapos.data.tokenizer import train_bpe

    return train_bpe(TEXT, vocab).save(directory)


def hf_config(kind: str, **overrides):
    """A tiny config of each architecture, context CONTEXT; weights N(0, 0.1) so attention is not flat."""
    import transformers as T

    common = dict(vocab_size=VOCAB, initializer_range=0.1)
    if kind == "gpt2":
        c = T.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            n_positions=CONTEXT,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
    elif kind == "gpt_neox":
        c = T.GPTNeoXConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=96,
            max_position_embeddings=CONTEXT,
            rotary_pct=0.25,
            **common,
        )
    elif kind == "bloom":  # 6 heads: ALiBi slopes for a head count that is not a power of two
        c = T.BloomConfig(n_layer=2, hidden_size=48, n_head=6, seq_length=CONTEXT, **common)
    elif kind == "llama":
        c = T.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=CONTEXT,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            **common,
        )
    elif kind == "mistral":
        c = T.MistralConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=96,
            max_position_embeddings=CONTEXT,
            sliding_window=None,
            tie_word_embeddings=True,
            **common,
        )
    elif kind == "qwen2":
        c = T.Qwen2Config(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=CONTEXT,
            tie_word_embeddings=True,
            **common,
        )
    elif kind == "smollm3":  # NoPE on layers 1 and 3 (no_rope_layers = [1, 0, 1, 0])
        c = T.SmolLM3Config(
            num_hidden_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=CONTEXT,
            no_rope_layer_interval=2,
            tie_word_embeddings=True,
            pad_token_id=None,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
    else:
        raise ValueError(kind)
    for k, v in overrides.items():
        setattr(c, k, v)
    return c


def save_hf(kind: str, directory: Path, seed: int = 0, **overrides):
    """Build a random model of ``kind``, save it with its tokenizer to ``directory``; return the model."""
    import transformers as T

    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(hf_config(kind, **overrides), attn_implementation="eager")
    model.float().eval()
    if kind == "qwen2":  # HF initialises biases at zero: make the Q/K/V biases matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


def ours_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    with torch.no_grad():
        return model(tokens, pos)


def ours_cached_logits(model, tokens: torch.Tensor, first: int, chunk: int = 7) -> torch.Tensor:
    """Prefill ``first`` tokens, then feed the rest in chunks of ``chunk`` and single tokens."""
    cache = model.new_cache()
    outs, s, T = [], 0, tokens.shape[1]
    steps = [first] + [chunk] * 3
    with torch.no_grad():
        while s < T:
            n = steps.pop(0) if steps else 1
            e = min(s + n, T)
            outs.append(model(tokens[:, s:e], torch.arange(s, e).unsqueeze(0), cache))
            s = e
    return torch.cat(outs, dim=1)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def make_run(directory: Path, seed: int = 0, **model_options) -> Path:
    """An extrapos run directory holding a randomly initialised model (init std 0.1) and a tokenizer."""
    from extrapos.model import Decoder, model_config
    from extrapos.run import checkpoint as ckpt_io
    from extrapos.run.config import DataConfig, RunConfig, TrainConfig

    torch.manual_seed(seed)
    opts = dict(n_layers=2, d_model=64, n_heads=4, vocab_size=VOCAB, train_length=CONTEXT, init_std=0.1)
    opts.update(model_options)
    cfg = model_config(**opts)
    model = Decoder(cfg)
    with torch.no_grad():  # non-trivial norms and biases, so that a dropped one shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    directory.mkdir(parents=True)
    tok = write_tokenizer(directory)
    run_cfg = RunConfig(cfg, DataConfig(tokenizer=str(tok)), TrainConfig())
    (directory / "config.toml").write_text(run_cfg.to_toml())
    ckpt_io.save_checkpoint(directory, 0, model, None, {})
    return directory
