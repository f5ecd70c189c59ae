"""`extrapos extend`: continue a run's training at L_e = K x L_t (segmented-sequence context extension)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "extend",
        help="extend a run's context to K x L_t (segmented-sequence training)",
        description="Continue RUN's training at L_e = K x L_t with chunk / prefix / full / randompos "
        "sampling, or the continue control, on a compute-equivalent token budget.",
    )
    p.add_argument("run", help="the run directory to extend")
    p.add_argument(
        "--method",
        required=True,
        metavar="METHOD",
        help="chunk, prefix, full, randompos, pose, or continue (the domain-adaptation control)",
    )
    p.add_argument(
        "--alpha", type=float, default=None, help="segment fraction for chunk / prefix (default 0.25)"
    )
    p.add_argument("--factor", type=int, default=2, help="L_e / L_t (default 2)")
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


def run(args) -> int:
    from extrapos.files import check_text
    from extrapos.training.extend import extend

    check_text(args.out, "--out")

    result = extend(
        args.run,
        args.method,
        args.factor,
        args.alpha,
        args.out,
        args.tokens,
        args.rope_interpolation,
        args.overrides,
        resume=args.resume,
        progress=not args.no_progress,
        rope_scaling=args.rope_scaling,
    )
    print(
        f"done: {result.steps} steps, {result.tokens:,} tokens in {result.wall_time:.1f}s -> {result.run_dir}"
    )
    return 0
