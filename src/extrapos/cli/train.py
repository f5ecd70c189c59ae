"""`extrapos train` and `extrapos presets`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "train",
        help="train a language model with a positional encoding",
        description="Train a model from a TOML config or a preset (e.g. cpu/tiny).",
    )
    p.add_argument("--config", default=None, help="a .toml file or a preset name (see `extrapos presets`)")
    p.add_argument("--data", default=None, help="a prepared data directory (default: the preset's corpus)")
    p.add_argument("--out", default=None, help="run directory (default: runs/<config name>)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set train.lr=3e-4 (repeatable)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    ps = sub.add_parser(
        "presets",
        help="list the shipped config presets, then the extension presets (extrapos extend --preset)",
    )
    ps.set_defaults(func=run_presets)


def run(args: argparse.Namespace) -> int:
    from extrapos.files import check_text
    from extrapos.run.config import load_config, load_run_config, with_overrides
    from extrapos.training.trainer import train

    for flag in ("config", "data", "out"):
        check_text(getattr(args, flag), f"--{flag}")

    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.dir={json.dumps(str(args.data))}")
    out = (
        Path(args.out) if args.out else Path("runs") / (Path(args.config).stem if args.config else "default")
    )
    if not args.resume or args.config:
        cfg = load_config(args.config, overrides)
    elif overrides:  # --resume --set KEY=VALUE: the saved config with the change (train refuses unsafe ones)
        cfg = with_overrides(load_run_config(out), overrides)
    else:
        cfg = None  # the run's own saved config
    result = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    val = f", validation loss {result.val_loss:.4f}" if result.val_loss is not None else ""
    print(
        f"done: {result.steps} steps, {result.tokens:,} tokens in {result.wall_time:.1f}s, "
        f"final loss {result.final_loss:.4f}{val} -> {result.run_dir}"
    )
    return 0


def run_presets(args: argparse.Namespace) -> int:
    from extrapos.presets import preset_names
    from extrapos.training.extension_presets import PRESETS

    print("\n".join(preset_names()))
    print("\nextension presets (extrapos extend RUN --preset NAME):")
    width = max(map(len, PRESETS))
    for p in PRESETS.values():
        alpha = f"-{p.alpha:g}" if p.alpha is not None else ""
        print(f"{p.name:<{width}}  {p.method}{alpha} x{p.factor}: {p.summary} ({p.source})")
    return 0
