"""`extrapos doctor`: this machine's capabilities, and every encoding checked on its fastest path."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: device, capability, and every encoding against the float64 reference",
        description="One table: the device, its capability, torch and bf16; then one training step and one "
        "cached decode per registered encoding on the fastest path here (CUDA: bf16 autocast; CPU: fp32), "
        "each against float64 on the same inputs (docs/distributed.md). Exit status 1 if any disagrees.",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--encodings", default=None, help="comma-separated encodings (default: every one)")
    p.add_argument("--no-speed", action="store_true", help="skip the timed GPT-2-small training step")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON here")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from extrapos.errors import UserError
    from extrapos.files import atomic_write, check_text
    from extrapos.owned import check_owned_file, json_with_keys
    from extrapos.positions.registry import spec
    from extrapos.tools.doctor import doctor, format_report

    check_text(args.json, "--json")
    if args.json:  # before the checks run: a run's file or the user's own is never replaced
        check_owned_file(args.json, "--json", "extrapos doctor", json_with_keys("machine", "checks"))
        folder = Path(args.json).parent
        # a missing folder, found after minutes of checks, was named as the temporary file it could not hold
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise UserError(
                f"--json {args.json} cannot be written: the folder {folder} {what}; create it first or give "
                "a path in an existing folder."
            )
    encodings = None
    if args.encodings is not None:
        encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
        if not encodings:
            raise UserError("--encodings is empty; name encodings (see `extrapos encodings`) or drop it.")
        for name in encodings:
            spec(name)  # an unknown name is one sentence listing the known ones
    report = doctor(args.device, encodings, speed=not args.no_speed, progress=not args.no_progress)
    print(format_report(report))
    if args.json:
        atomic_write(args.json, json.dumps(report.to_dict(), indent=1))
    return 0 if report.ok else 1
