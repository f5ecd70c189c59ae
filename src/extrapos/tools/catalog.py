"""The catalog of positional encodings (`extrapos encodings`).

For each: name, family, learnable parameter count in a model of the given size preset, options with
their defaults, the paper it comes from, and whether a layer schedule may put it on some layers only;
as an aligned table or as JSON (``--json``).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

DEFAULT_SIZE = "gpt2-tiny"


def encodings_table(size: str = DEFAULT_SIZE) -> list[dict[str, Any]]:
    """One row per registered encoding, for a model of the given size preset."""
    import torch

    from extrapos.model import model_config
    from extrapos.positions.base import EncodingContext
    from extrapos.positions.registry import build_encoding, build_options, default_options, names, spec

    ctx = EncodingContext.of(model_config(size))  # an encoder preset's context is bidirectional
    rows = []
    for name in names():
        s = spec(name)
        parameters = None  # an encoding the preset's model cannot use (a causal one in an encoder)
        if ctx.causal or not s.cls.causal_only:
            with torch.device("meta"):  # shapes only: no memory, no init cost
                parameters = sum(p.numel() for p in build_encoding(name, ctx).parameters())
        rows.append(
            {
                "name": name,
                "family": s.cls.family,
                "parameters": parameters,
                "options": default_options(name),
                # false for the encodings of the embeddings, which a layer schedule refuses (schedule.py)
                "schedulable": not s.cls.acts_on_embeddings(build_options(name)),
                "description": s.description,
                "paper": s.cls.paper,
            }
        )
    return rows


def _format_options(options: dict[str, Any]) -> str:
    return (
        ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in options.items()) or "-"
    )


def format_table(rows: list[dict[str, Any]], options_width: int = 56) -> str:
    """An aligned text table; long option lists wrap within their column."""
    header = ["name", "family", "params", "options (defaults)", "paper"]
    cells = [
        [
            r["name"],
            r["family"],
            "-" if r["parameters"] is None else f"{r['parameters']:,}",
            textwrap.wrap(_format_options(r["options"]), options_width) or ["-"],
            r["paper"],
        ]
        for r in rows
    ]
    w = [max(len(header[i]), *(len(c[i]) for c in cells)) for i in range(3)]
    w.append(max(len(header[3]), *(len(line) for c in cells for line in c[3])))
    lines = [
        f"{header[0]:<{w[0]}}  {header[1]:<{w[1]}}  {header[2]:>{w[2]}}  {header[3]:<{w[3]}}  {header[4]}"
    ]
    lines.append("-" * len(lines[0]))
    for name, family, params, opts, paper in cells:
        lines.append(f"{name:<{w[0]}}  {family:<{w[1]}}  {params:>{w[2]}}  {opts[0]:<{w[3]}}  {paper}")
        lines += [f"{'':<{w[0]}}  {'':<{w[1]}}  {'':>{w[2]}}  {more}" for more in opts[1:]]
    return "\n".join(lines)


def encodings_text(size: str = DEFAULT_SIZE, as_json: bool = False) -> str:
    rows = encodings_table(size)
    if as_json:
        return json.dumps({"size": size, "encodings": rows}, indent=2)
    fixed = ", ".join(r["name"] for r in rows if not r["schedulable"])
    text = (
        f"positional encodings (learnable parameters for a {size} model)\n\n"
        + format_table(rows)
        + "\n\n"
        + textwrap.fill(
            'Layer schedules: model.positions.layers = "every 4th", "all but every 4th", "every 2nd from 0" '
            "or [0, 2] puts the encoding on those layers and model.positions.others (default nope) on the "
            f"rest; {fixed} act on the embeddings and cannot be scheduled (docs/attention.md).",
            100,
        )
    )
    causal = ", ".join(r["name"] for r in rows if r["parameters"] is None)
    if causal:  # an encoder preset: its bidirectional model has no place for them (params -)
        text += f"\n{causal} are causal only: the bidirectional {size} model cannot use them."
    return text
