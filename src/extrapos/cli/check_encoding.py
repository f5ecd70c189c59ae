"""`extrapos check-encoding NAME`: the checks the project runs on its own encodings, on any one."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-encoding",
        help="check an encoding (built-in or plug-in): causality, cache, fast path, state, export",
        description="Runs on one registered encoding, a built-in or a plug-in's, what extrapos proves of its "
        "own: options within declared bounds; no information from the future; cached decoding equal to the "
        "full forward; the fast path equal to the float64 reference; weights that save and reload; and, "
        "with transformers installed, an export that loads back with the same logits. One table, each line "
        "with its bound and what was measured (docs/plugins.md). Exit status 1 if a line fails.",
    )
    p.add_argument("name", help="the encoding (see `extrapos encodings`)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the encoding, e.g. --option scaling=yarn (repeatable)",
    )
    p.add_argument("--device", default="cpu", help="where the fast path runs: cpu (default), auto, cuda")
    p.add_argument("--no-export", action="store_true", help="skip the export line (it loads transformers)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from extrapos.cli.eval import parse_value
    from extrapos.errors import UserError
    from extrapos.positions.registry import spec
    from extrapos.tools.conformance import check_encoding_conformance, format_conformance

    spec(args.name)  # an unknown name is one sentence listing the known ones
    options = {}
    for item in args.option:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--option wants KEY=VALUE, got {item!r}; e.g. --option scaling=yarn.")
        options[key.strip()] = parse_value(value.strip())
    extra = {}
    if not args.no_export:
        from extrapos.integrations.hf_remote.conformance import export_line

        extra["export"] = export_line
    report = check_encoding_conformance(args.name, options, args.device, extra)
    print(json.dumps(report.to_dict(), indent=1) if args.json else format_conformance(report))
    return 0 if report.ok else 1
