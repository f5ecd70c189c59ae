"""extrapos' llama + RoPE training step against Hugging Face's ``LlamaForCausalLM`` of the same shape."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from extrapos.bench.measure import clock_now, interleaved, timing_spread
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, model_config

#: the shape of the peer comparison (issue 15): Llama + RoPE, d 256, 4 layers, 4 heads, MLP 768,
#: vocab 8192, tied embeddings, batch 8 x 256, forward + backward + AdamW, fp32
PEER_SHAPE = {
    "d_model": 256,
    "n_layers": 4,
    "n_heads": 4,
    "mlp_hidden": 768,
    "vocab": 8192,
    "batch": 8,
    "seq": 256,
}


def bench_peer(
    rounds: int = 7, progress: Callable[[], object] | None = None, clock: str = "wall"
) -> dict[str, Any] | None:
    """extrapos llama + RoPE vs Hugging Face ``LlamaForCausalLM`` of the same shape, one training step
    each (fp32, fused AdamW on both sides), interleaved rounds, medians; None without transformers.

    Each side runs its own usual loss: extrapos the trainer's (the head fused with the loss,
    losses.py), Hugging Face its logits and an fp32 cross-entropy over them.
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    from extrapos.model import count_parameters

    p = PEER_SHAPE
    torch.manual_seed(0)
    ours = Decoder(
        model_config(
            flavour="llama",
            n_layers=p["n_layers"],
            d_model=p["d_model"],
            n_heads=p["n_heads"],
            mlp_hidden=p["mlp_hidden"],
            vocab_size=p["vocab"],
            tie_embeddings=True,
            train_length=p["seq"],
            positions={"name": "rope"},
        )
    )
    hf_cfg = LlamaConfig(
        vocab_size=p["vocab"],
        hidden_size=p["d_model"],
        intermediate_size=p["mlp_hidden"],
        num_hidden_layers=p["n_layers"],
        num_attention_heads=p["n_heads"],
        num_key_value_heads=p["n_heads"],
        max_position_embeddings=p["seq"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )
    hf = LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa", dtype=torch.float32).train()
    n_ours = count_parameters(ours)["total"]
    n_hf = sum(t.numel() for t in {id(t): t for t in hf.parameters()}.values())
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, p["vocab"], (p["batch"], p["seq"] + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(p["seq"]).expand(p["batch"], -1)
    mask = torch.ones(y.shape)
    opts = {
        "extrapos": torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True),
        "transformers": torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=True),
    }

    def step(name: str) -> float:
        t0 = clock_now(clock)
        if name == "extrapos":
            loss = model_loss_sum(ours, x, pos, y, mask) / mask.numel()
        else:
            logits = hf(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        if progress:
            progress()
        return clock_now(clock) - t0

    names = ["extrapos", "transformers"]
    for n in names:  # warm-up
        step(n)
    times = interleaved(names, max(7, rounds), step)
    med = {n: statistics.median(t) for n, t in times.items()}
    import transformers

    return {
        "shape": p,
        "rounds": max(7, rounds),
        "params_extrapos": n_ours,
        "params_transformers": n_hf,
        "transformers": transformers.__version__,
        **{f"{n}_ms": med[n] * 1e3 for n in names},
        **{f"{n}_spread": timing_spread(times[n]) for n in names},
        "ratio": med["extrapos"] / med["transformers"],
        # the same rounds on both sides: the per-round ratios are the verdict's noise (bench/noise.py)
        "ratio_rounds": [a / b for a, b in zip(times["extrapos"], times["transformers"])],
    }


def format_peer(r: dict[str, Any]) -> str:
    p = r["shape"]
    return (
        f"llama + RoPE training step (d {p['d_model']}, {p['n_layers']} layers, {p['n_heads']} heads, MLP "
        f"{p['mlp_hidden']}, vocab {p['vocab']}, tied, batch {p['batch']} x {p['seq']}, fp32, fwd + bwd + "
        "AdamW; "
        f"{r['params_extrapos']:,} vs {r['params_transformers']:,} parameters), median of {r['rounds']} "
        f"interleaved rounds, CPU capability {torch.backends.cpu.get_cpu_capability()}: extrapos "
        f"{r['extrapos_ms']:.0f} ms (spread {r['extrapos_spread']:.0%}), transformers {r['transformers']} "
        f"LlamaForCausalLM {r['transformers_ms']:.0f} ms (spread {r['transformers_spread']:.0%}), "
        f"ratio {r['ratio']:.2f}"
    )
