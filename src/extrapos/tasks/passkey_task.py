"""The passkey column defined in one place (``tasks/task.py``): retrieval of a key hidden at each depth of a
haystack of each length (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2). Its scoring is
``tasks/passkey.py``'s ``PasskeyEvaluator``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from extrapos.errors import UserError
from extrapos.tasks.task import Command, Task, columns_of, option

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from extrapos.model import ModelConfig
    from extrapos.run.config import RunConfig


@dataclass
class PasskeyColumns:
    """Passkey's options: a command's flags and a sweep's ``passkey = {...}`` (accuracy per length, the
    mean over depths)."""

    depths: list[float] = option(factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], help="needle depths in [0, 1]")
    trials: int = option(10, help="prompts per (length, depth) cell")
    mode: str = option("rank", help="rank (log-likelihood rank among --candidates), generate, or both")
    candidates: int = option(10, help="keys ranked in rank mode (the true one included)")
    haystack: str = option("filler", help="filler, corpus (the run's held-out split) or a data dir")
    key_digits: int = option(5, help="digits of the pass key")
    seed: int = option(0, help="the prompts' seed")


class PasskeyTask(Task):
    name: ClassVar[str] = "passkey"
    evaluator: ClassVar[str] = "extrapos.tasks.passkey:PasskeyEvaluator"
    columns: ClassVar[type] = PasskeyColumns
    command: ClassVar[str | None] = "passkey"
    help: ClassVar[str] = "passkey / needle retrieval at 1x..16x the training length"
    description: ClassVar[str] = (
        "Hide 'The pass key is NNNNN' at each depth of a haystack of each length and ask for it (Mohtashami "
        "& Jaggi 2023); score exact-match generation and/or the rank of the true key among alternatives."
    )
    plot_help: ClassVar[str] = "write the length x depth heatmap here (PNG)"
    force_flag: ClassVar[bool] = True

    def extra_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--split", default="test", help="the held-out split of --haystack corpus")

    def run_command(self, args: argparse.Namespace, cmd: Command) -> list[str]:
        """Under torchrun the prompts are scored by all ranks together (each ends with the whole result);
        rank 0 prints."""
        from extrapos.run.runtime import init_distributed, resolve_device

        engine = self.module()
        lengths = cmd.lengths()
        if args.plot:
            engine.check_plot_path(
                args.run, args.plot
            )  # before any work: the result is never followed by an error
        rank, _, device = init_distributed(resolve_device(args.device, "--device"))
        options = engine.PasskeyOptions(
            **columns_of(args, self.columns),
            lengths=lengths,
            split=args.split,
            position_options=cmd.position_options(lengths),
            step=args.step,
        )
        result = cmd.score(options, device, not args.no_progress and rank == 0, args.force)
        if rank != 0:
            return []
        # every metric computed (--mode both: rank accuracy, mean rank, MRR, exact match)
        lines = [engine.format_all(result)]
        if args.plot:
            lines.append(f"-> {engine.plot_heatmap(result, args.plot)}")
        return [*lines, f"-> {cmd.saved(result)}"]

    def check_columns(self, spec: Any) -> None:
        from extrapos.tasks.common import MAX_KEY_DIGITS, check_seed

        if spec.mode not in ("rank", "generate", "both"):
            raise UserError(f"mode must be rank, generate or both, got {spec.mode!r}")
        if spec.trials < 1:
            raise UserError(f"trials must be at least 1, got {spec.trials}")
        if not spec.depths or any(not 0 <= d <= 1 for d in spec.depths):
            raise UserError(f"depths must be a non-empty list of fractions in [0, 1], got {spec.depths}")
        if not 1 <= spec.key_digits <= MAX_KEY_DIGITS:
            raise UserError(f"key_digits must be between 1 and {MAX_KEY_DIGITS}, got {spec.key_digits}")
        self.module().check_candidates(spec.mode, spec.candidates, spec.key_digits)
        check_seed(spec.seed, "seed")

    def check_row(self, spec: Any, model: ModelConfig, lengths: list[int]) -> None:
        self.module().check_passkey_memory(
            model,
            lengths,
            spec.trials,
            spec.mode,
            spec.candidates,
            None,
            "cpu",
            advice="lower the sweep's lengths or passkey.trials",
        )

    def check_row_tokens(self, spec: Any, cfg: RunConfig, run_dir: Path | None, lengths: list[int]) -> None:
        """The shortest prompt must hold the needle and the question (``score_passkey`` refuses it after the
        row trained otherwise): counted with the row's tokenizer where it exists, else a bound
        (``passkey.prompt_floor``)."""
        engine = self.module()
        need, exact = engine.prompt_floor(cfg.data, run_dir, spec.key_digits)
        advice = "drop the shortest of the sweep's lengths (an extension row: its smallest factor)"
        engine.check_prompt_fits(lengths, cfg.model.train_length, need, exact, advice)

    # ---- the report ----------------------------------------------------------------------------------

    def describe(self, rows: Sequence[Any]) -> str:
        first = next(row.tasks[self.name] for row in rows if self.name in row.tasks)
        req = first["request"]
        chance = f"; chance {1 / req['candidates']:.2f}" if first.get("metric") == "rank_accuracy" else ""
        return (
            f"Passkey retrieval ({req['mode']}, haystack {req['haystack']}): accuracy per length, the mean "
            "over "
            f"needle depths {', '.join(f'{d:g}' for d in req['depths'])} ({req['trials']} trials per "
            f"cell{chance}); "
            "the per-depth grid is in each row's JSON under tasks/passkey/."
        )
