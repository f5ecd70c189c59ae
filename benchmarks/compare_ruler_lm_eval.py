"""RULER through lm-evaluation-harness beside `extrapos ruler` on one run (docs/results/ruler/lm-eval.md).

Reads the results both commands wrote in RUN/eval/ (lm-eval's with ``--log-samples``, so its prompts and
per-document scores are there) and puts them side by side per task and length: the prompt's token length in
the run's tokenizer (lm-eval's: the context it handed the model, answer prefix included, and how many of them
the model had to cut from the left; extrapos': rebuilt from the request's seed exactly as `extrapos ruler`
built them), the generation budget, the needles and haystack units in the prompt, the score with its 95%
interval (the same bootstrap over examples for both: ``stats.loss_interval``, example as unit) and lm-eval's
own stderr, how many predictions write a value the prompt holds (what a copying model does), and whether
each side's per-example scores equal the other side's metric on the same predictions. Writes
the table as JSON and prints it as Markdown.

    python benchmarks/compare_ruler_lm_eval.py RUN --lm-eval lm-eval-ruler-512 lm-eval-ruler-1024 \
        --ruler ruler-offline-512 ruler-offline-1024 --out docs/results/ruler/lm-eval/comparison.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

from extrapos.data.ruler_names import TASK_NAMES
from extrapos.data.ruler_prompts import RulerBuilder
from extrapos.data.ruler_tasks import GENERATE, TASKS
from extrapos.report import stats
from extrapos.run.directory import load_run
from extrapos.tasks.ruler import RulerOptions
from extrapos.tasks.ruler_metric import postprocess, recall

#: lm-eval's task name -> extrapos' (the same RULER task)
LM_EVAL_NAMES = {
    "niah_single_1": "niah_single_1",
    "niah_multikey_2": "niah_multikey_2",
    "niah_multikey_3": "niah_multikey_3",
    "ruler_vt": "vt",
    "ruler_cwe": "cwe",
    "ruler_fwe": "fwe",
}
_NEEDLE = re.compile(r"One of the special magic")
#: the values a prompt offers to copy, per family: needle values, variable names, listed words, coded words
_VALUES = {
    "niah": re.compile(r"is: (\S+?)\.(?:\s|$)"),
    "vt": re.compile(r"VAR ([A-Z]+)"),
    "cwe": re.compile(r"\d+\. ([\w-]+)"),
    "fwe": re.compile(r"(?<![\w.])([a-z]{6})(?![\w])"),
}


def copies(task: str, prompt: str, prediction: str) -> bool:
    """Whether the prediction writes a value the prompt holds (a needle's value, a variable, a listed or coded
    word), whole words, ignoring case: what a model that copies from the context does."""
    family = TASKS[task].family
    text = prompt
    if family == "fwe":  # the coded text only: the instruction's own six-letter words are not values
        text = prompt[prompt.find("coded words.") : prompt.rfind("Question:")]
    values = {v.lower() for v in _VALUES[family].findall(text)}
    words = set(re.findall(r"[\w-]+", prediction.lower()))
    return bool(values & words)


def interval(values: list[float]) -> list[float]:
    ci = stats.loss_interval(values, [1] * len(values))
    return [round(float(ci.low), 4), round(float(ci.high), 4)]


def spread(xs: list[int]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def lm_eval_cells(run: Any, result: dict[str, Any]) -> list[dict[str, Any]]:
    (length,) = result["request"]["metadata"]["max_seq_lengths"]
    max_length = result["max_length"]
    cells = []
    for name, samples in result["samples"].items():
        budget = int(samples[0]["arguments"][0][1]["max_gen_toks"])
        prompts = [s["arguments"][0][0] for s in samples]
        tokens = [len(run.tokenizer.encode(p)) for p in prompts]
        scores = [float(s[str(length)]) for s in samples]
        preds = [s["filtered_resps"][0] for s in samples]
        task_result = result["results"][name]
        # lm-eval's per-document score against extrapos' metric on the same prediction and references
        ours = [recall(postprocess(p), s["doc"]["outputs"], "all") for p, s in zip(preds, samples)]
        cells.append(
            {
                "side": "lm-eval",
                "task": LM_EVAL_NAMES[name],
                "lm_eval_task": name,
                "length": length,
                "n": len(samples),
                "prompt_tokens": spread(tokens),
                "budget": budget,
                "cut_from_left": sum(t > max_length - budget for t in tokens),
                "needles_in_prompt": spread([len(_NEEDLE.findall(p)) for p in prompts]),
                "score": float(np.mean(scores)),
                "interval": interval(scores),
                "lm_eval_stderr": task_result.get(f"{length}_stderr,none"),
                "predictions_copying": sum(copies(LM_EVAL_NAMES[name], a, p) for a, p in zip(prompts, preds)),
                "other_metric_equal": ours == scores,
            }
        )
    return cells


def ruler_cells(run: Any, result: dict[str, Any]) -> list[dict[str, Any]]:
    req = result["request"]
    opts = RulerOptions(**{k: v for k, v in req.items()})
    builder = RulerBuilder(run.tokenizer, opts.shape)
    L = result["train_length"]
    cells = []
    for cell in result["results"]:
        task, k = cell["task"], cell["ev"]
        # the prompts `extrapos ruler` scored: the same builder, seed and draw order (tasks/ruler.py)
        rng = np.random.default_rng([req["seed"], k, TASK_NAMES.index(task), 0])
        built = [builder.build(task, k * L, rng) for _ in range(req["trials"])]
        values = cell["per_example"]["recall"][0]
        # extrapos' per-example recall against lm-eval's string_match_all, same predictions and references
        theirs = [
            string_match_all(postprocess_pred([p]), [[builder.reference(a) for a in b.text.answers]])
            for p, b in zip(cell["predictions"], built)
        ]
        cells.append(
            {
                "side": "extrapos",
                "task": task,
                "length": cell["length"],
                "n": cell["n"],
                "prompt_tokens": spread([len(p.tokens) for p in built]),
                "prompt_and_answer_tokens": spread([len(p.tokens) + len(p.target) for p in built]),
                "budget": req["max_new_tokens"] or GENERATE[TASKS[task].family],
                "needles_in_prompt": spread(
                    [len(_NEEDLE.findall(run.tokenizer.decode(p.tokens))) for p in built]
                ),
                "score": cell["recall"],
                "interval": interval(values),
                "predictions_copying": sum(
                    copies(task, run.tokenizer.decode(b.tokens), p)
                    for b, p in zip(built, cell["predictions"])
                ),
                "other_metric_equal": theirs == values,
            }
        )
    return cells


def markdown(cells: list[dict[str, Any]]) -> str:
    rows = [
        "| task | length | side | n | prompt tokens (min / median / max) | budget | cut | needles | "
        "recall [95%] | copies |",
        "|---|---:|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for c in sorted(cells, key=lambda c: (TASK_NAMES.index(c["task"]), c["length"], c["side"])):
        t, nd = c["prompt_tokens"], c["needles_in_prompt"]
        rows.append(
            f"| {c['task']} | {c['length']} | {c['side']} | {c['n']} "
            f"| {t['min']} / {t['median']:g} / {t['max']} "
            f"| {c['budget']} | {c.get('cut_from_left', '–')} | {nd['median']:g} | {c['score']:.2f} "
            f"[{c['interval'][0]:.2f}, {c['interval'][1]:.2f}] | {c['predictions_copying']} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--lm-eval", nargs="+", required=True, help="lm-eval result names in RUN/eval/")
    ap.add_argument("--ruler", nargs="+", required=True, help="extrapos ruler result names in RUN/eval/")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    run = load_run(args.run, device="cpu")
    eval_dir = Path(args.run) / "eval"
    cells = []
    for name in args.lm_eval:
        cells += lm_eval_cells(run, json.loads((eval_dir / f"{name}.json").read_text()))
    for name in args.ruler:
        cells += ruler_cells(run, json.loads((eval_dir / f"{name}.json").read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"run": args.run, "cells": cells}, indent=1) + "\n")
    print(markdown(cells))


if __name__ == "__main__":
    main()
