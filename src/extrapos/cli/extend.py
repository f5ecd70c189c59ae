"""`extrapos extend`: continue a run's training at L_e = K x L_t (segmented-sequence context extension)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from extrapos.training.trainer import TrainResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "extend",
        help="extend a run's context to K x L_t (segmented-sequence training)",
        description="Continue RUN's training at L_e = K x L_t with chunk / prefix / full / randompos "
        "sampling, or the continue control, on a compute-equivalent token budget.",
    )
    p.add_argument("run", help="the run directory to extend")
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="a published recipe: sets --method, --alpha and --factor (`extrapos presets` lists them; "
        "segmented-chunk-x4: the segmented-sequences paper's chunk-0.25 to 4 x L_t)",
    )
    p.add_argument(
        "--method",
        default=None,
        metavar="METHOD",
        help="chunk, prefix, full, randompos, pose, or continue (the domain-adaptation control); "
        "required without --preset",
    )
    p.add_argument(
        "--alpha", type=float, default=None, help="segment fraction for chunk / prefix (default 0.25)"
    )
    p.add_argument("--factor", type=int, default=None, help="L_e / L_t (default 2)")
    p.add_argument("--out", default=None, help="the new run directory (default: RUN-<method>-x<factor>)")
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="token budget instead of the compute-equivalent one (same for every method)",
    )
    p.add_argument(
        "--rope-interpolation", action="store_true", help="RoPE: add linear position interpolation"
    )
    p.add_argument(
        "--rope-scaling",
        default=None,
        metavar="NAME",
        help="RoPE: train with this scaling at factor L_e / L_t: linear, ntk, dynamic, yarn or llama3",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key of the extension run (repeatable)",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted extension run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def recipe(args: argparse.Namespace) -> tuple[str, int, float | None]:
    """--method, --factor, --alpha as given, or as --preset sets them (not both)."""
    from extrapos.errors import UserError

    if args.preset is None:
        if args.method is None:
            raise UserError("extend needs --method METHOD or --preset NAME (`extrapos presets` lists them).")
        return args.method, 2 if args.factor is None else args.factor, args.alpha
    from extrapos.training.extension_presets import extension_preset

    preset = extension_preset(args.preset)
    given = [
        f for f, v in (("--method", args.method), ("--alpha", args.alpha), ("--factor", args.factor)) if v
    ]
    if given:
        raise UserError(
            f"--preset {preset.name} sets the method ({preset.method}), alpha and factor ({preset.factor}); "
            f"drop {given[0]} or drop --preset."
        )
    return preset.method, preset.factor, preset.alpha


def run(args: argparse.Namespace) -> int:
    from extrapos.files import check_text
    from extrapos.training.extend import extend

    check_text(args.out, "--out")

    method, factor, alpha = recipe(args)
    result = extend(
        args.run,
        method,
        factor,
        alpha,
        args.out,
        args.tokens,
        args.rope_interpolation,
        args.overrides,
        resume=args.resume,
        progress=not args.no_progress,
        rope_scaling=args.rope_scaling,
        preset=args.preset,
    )
    print(
        f"done: {result.steps} steps, {result.tokens:,} tokens in {result.wall_time:.1f}s -> {result.run_dir}"
    )
    summary(args.run, result)
    return 0


def summary(parent: str, result: TrainResult) -> None:
    import json

    from extrapos.training.extension_plan import summary_lines

    record_file = result.run_dir / "parent.json"
    if record_file.is_file():
        print("  " + "\n  ".join(summary_lines(result, json.loads(record_file.read_text()), parent)))
