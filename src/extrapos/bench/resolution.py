"""bf16 position resolution: the reason ExQPE exists.

bf16 keeps 8 significant bits, so there are only ~16e3 representable values in [0, 1] and their
spacing grows with magnitude (2^-8 near 1, 2^-6 near 4). ExPE's p_n = S + theta n with the papers'
theta = 1/2048 moves by less than one bf16 step per position once p passes ~0.25, so neighbouring
positions round to the same vector; ExQPE moves one of its l dims by theta2 = 1/16 at every
position, a step bf16 resolves far out. Under bf16 autocast this rounding happens for real: the
Q/K projections read the overridden inputs in bf16.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def expe_vectors(n: int, l: int, S: float = 0.0, theta: float = 1 / 2048) -> torch.Tensor:
    """ExPE's overrides (p_m, ..., p_{m+l-1}) for positions m < n, in fp64: (n, l)."""
    m = torch.arange(n, dtype=torch.float64).unsqueeze(1) + torch.arange(l, dtype=torch.float64)
    return S + theta * m


def exqpe_vectors(
    n: int, l: int, S: float = 0.0, theta1: float = 1 / 2048, theta2: float = 1 / 16
) -> torch.Tensor:
    """ExQPE's closed form p_m[k] = S + k theta1 + theta2 c_k(m), c_k(m) = floor((m - k) / l) + 1 if m >=
    k."""
    m = torch.arange(n, dtype=torch.int64).unsqueeze(1)
    k = torch.arange(l, dtype=torch.int64)
    c = torch.where(m >= k, torch.div(m - k, l, rounding_mode="floor") + 1, torch.zeros_like(m - k))
    return S + k.double() * theta1 + theta2 * c.double()


def distinct_rows(x: torch.Tensor) -> int:
    return int(torch.unique(x, dim=0).shape[0])


def position_resolution(
    train_length: int = 512,
    multiples: Sequence[int] = (1, 2, 4, 8, 16),
    l: int = 24,
    theta: float = 1 / 2048,
    theta1: float = 1 / 2048,
    theta2: float = 1 / 16,
) -> dict[str, Any]:
    """Distinct position vectors that survive bf16 (and fp16, fp32) rounding, up to k x L_t positions."""
    n_max = max(multiples) * train_length
    tables = {
        "expe": expe_vectors(n_max, l, theta=theta),
        "exqpe": exqpe_vectors(n_max, l, theta1=theta1, theta2=theta2),
    }
    rows = []
    for name, vec in tables.items():
        for k in multiples:
            n = k * train_length
            row = {"encoding": name, "ev": k, "positions": n}
            for dtype in ("bfloat16", "float16", "float32"):
                row[dtype] = distinct_rows(vec[:n].to(getattr(torch, dtype)))
            # first position whose bf16 vector equals its predecessor's: where ExPE stops resolving neighbours
            b = vec[:n].to(torch.bfloat16)
            same = (b[1:] == b[:-1]).all(dim=1).nonzero()
            row["first_bf16_collision"] = int(same[0]) + 1 if len(same) else None
            rows.append(row)
    return {
        "train_length": train_length,
        "l": l,
        "theta": theta,
        "theta1": theta1,
        "theta2": theta2,
        "rows": rows,
    }


def format_resolution(r: dict[str, Any]) -> str:
    lines = [
        f"Distinct position vectors after rounding (L_t = {r['train_length']}, l = {r['l']}, ExPE theta = "
        f"1/{round(1 / r['theta'])}, ExQPE theta1 = 1/{round(1 / r['theta1'])}, theta2 = "
        f"1/{round(1 / r['theta2'])}):",
        "",
        "| encoding | ev | positions | distinct bf16 | distinct fp16 | distinct fp32 | first bf16 repeat |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['encoding']} | {row['ev']} | {row['positions']} | {row['bfloat16']} | {row['float16']} "
            "| "
            f"{row['float32']} | {row['first_bf16_collision'] or '–'} |"
        )
    return "\n".join(lines)


def bf16_eval_delta(
    run_dirs: Sequence[str | Path],
    lengths: Sequence[int | float] = (1, 4, 16),
    max_tokens: int = 16_384,
    progress: bool = False,
) -> list[dict]:
    """Evaluation loss of each run in fp32 and under bf16 autocast at the same lengths."""
    from extrapos.evaluate import EvalRequest, evaluate

    out = []
    for run in run_dirs:
        res = {}
        for precision in ("fp32", "bf16"):
            req = EvalRequest(lengths=list(lengths), max_tokens=max_tokens, precision=precision)
            res[precision] = evaluate(run, req, name=f"bf16-check-{precision}", progress=progress)
        for a, b in zip(res["fp32"]["results"], res["bf16"]["results"]):
            out.append(
                {
                    "run": str(run),
                    "encoding": res["fp32"]["encoding"],
                    "ev": a["ev"],
                    "fp32": a["loss"],
                    "bf16": b["loss"],
                    "delta": b["loss"] - a["loss"],
                }
            )
    return out


def format_bf16_delta(rows: list[dict]) -> str:
    lines = ["| run | encoding | ev | loss fp32 | loss bf16 | bf16 - fp32 |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['encoding']} | {r['ev']} | {r['fp32']:.4f} | {r['bf16']:.4f} | "
            f"{r['delta']:+.4f} |"
        )
    return "\n".join(lines)
