"""A behaviour snapshot: the same scripted commands run on two versions of the code must write the same files.

A refactor that means to change nothing (issue 38's rule) is checked by running this script on the code
before and after it and diffing the two snapshots:

    PYTHONPATH=/path/to/old/src python benchmarks/behaviour_snapshot.py run /tmp/before
    PYTHONPATH=/path/to/new/src python benchmarks/behaviour_snapshot.py run /tmp/after
    python benchmarks/behaviour_snapshot.py diff /tmp/before /tmp/after

`run` trains tiny models (GPT-2 and Llama flavours, packed with a document mask, an encoder), extends one,
scores them with every evaluator (documents and stream protocols, scalings, attention statistics,
passkey, RULER, a synthetic task, lm-evaluation-harness on a local task), generates, exports, runs a
two-row comparison and rebuilds its report: about 5 minutes on 2 CPU cores. Every command runs in the
same working directory (so absolute paths inside the outputs match) with its own data cache, one thread
and fixed seeds; each command's console output is kept too. `diff` compares JSON and JSON-lines files
value by value with timing keys left out, console logs and Markdown reports with timings masked, and every
other file (checkpoints, safetensors, CSV, plots) byte for byte, and exits 1 on any difference.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

WORK = Path("/tmp/extrapos-behaviour-work")  # fixed: paths written into results are equal across versions

# Keys whose values are measurements of time, speed or the machine, not behaviour.
TIMING_KEY = re.compile(
    r"(seconds|_s$|^s$|time|wall|elapsed|duration|per_s|tok_s|tokens_per|throughput|date|started|finished"
    r"|host|pid|mfu|peak_memory|rss|load|version|python|torch|platform|cpu|threads_used)",
    re.IGNORECASE,
)
# Console text that varies run to run.
CONSOLE_NOISE = [
    (re.compile(r"\d+(\.\d+)?\s*(s|ms|min|h|seconds|minutes)\b"), "<time>"),
    (re.compile(r"\d[\d,.]*\s*[A-Za-z]+/s\b|\d[\d,.]*\s*s/it"), "<rate>"),
    (re.compile(r"\d\d:\d\d(:\d\d)?"), "<clock>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ][\d:.]+\S*"), "<date>"),
]

LM_EVAL_TASK = """task: behaviour_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/choice.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""


def commands(tasks: Path) -> list[tuple[str, list[str]]]:
    """(label, argv after `python -m extrapos`) in order; later commands use earlier runs."""
    tiny = ["--config", "cpu/tiny", "--no-progress", "--set", "train.steps=24", "--set", "train.log_every=8"]
    fast = ["--no-progress", "--max-tokens", "1024"]
    return [
        ("train-rope", ["train", *tiny, "--out", "runs/rope", "--set", "train.checkpoint_every=12"]),
        ("train-alibi", ["train", *tiny, "--out", "runs/alibi", "--set", "model.positions.name=alibi"]),
        ("train-cable", ["train", *tiny, "--out", "runs/cable", "--set", "model.positions.name=cable"]),
        ("train-fire", ["train", *tiny, "--out", "runs/fire", "--set", "model.positions.name=fire"]),
        (
            "train-expe-llama",
            [
                "train",
                *tiny,
                "--out",
                "runs/expe",
                "--set",
                "model.positions.name=expe",
                "--set",
                'model.flavour="llama"',
            ],
        ),
        (
            "train-t5-packed-mask",
            [
                "train",
                *tiny,
                "--out",
                "runs/t5",
                "--set",
                "model.positions.name=t5",
                "--set",
                "data.packed=true",
                "--set",
                "data.document_mask=true",
                "--set",
                'data.document_positions="restart"',
            ],
        ),
        (
            "train-encoder",
            [
                "train",
                "--config",
                "cpu/encoder",
                "--no-progress",
                "--out",
                "runs/encoder",
                "--set",
                "train.steps=16",
            ],
        ),
        (
            "extend-chunk",
            [
                "extend",
                "runs/rope",
                "--method",
                "chunk",
                "--factor",
                "2",
                "--tokens",
                "16384",
                "--out",
                "runs/rope-chunk",
                "--no-progress",
            ],
        ),
        ("eval-rope", ["eval", "runs/rope", *fast]),
        ("eval-rope-stream", ["eval", "runs/rope", *fast, "--protocol", "stream"]),
        ("eval-rope-yarn", ["eval", "runs/rope", *fast, "--rope-scaling", "yarn", "--lengths", "1,2,4"]),
        ("eval-alibi", ["eval", "runs/alibi", *fast]),
        ("eval-cable", ["eval", "runs/cable", *fast, "--protocol", "stream", "--boundary", "mask"]),
        ("eval-fire", ["eval", "runs/fire", *fast, "--lengths", "1,2"]),
        ("eval-expe-scale", ["eval", "runs/expe", *fast, "--scale", "0.5"]),
        ("eval-t5", ["eval", "runs/t5", *fast]),
        ("eval-encoder", ["eval", "runs/encoder", *fast, "--lengths", "1,2"]),
        ("eval-chunk", ["eval", "runs/rope-chunk", *fast, "--lengths", "1,2"]),
        ("attention", ["attention", "runs/rope", "--lengths", "1,2", "--max-tokens", "512", "--no-progress"]),
        (
            "passkey",
            [
                "passkey",
                "runs/rope",
                "--lengths",
                "1,2",
                "--trials",
                "2",
                "--no-progress",
                "--plot",
                "plots/passkey.png",
            ],
        ),
        (
            "ruler-rank",
            [
                "ruler",
                "runs/alibi",
                "--lengths",
                "12,16",
                "--trials",
                "2",
                "--mode",
                "rank",
                "--tasks",
                "niah_single_1,vt,cwe",
                "--no-progress",
            ],
        ),
        (
            "ruler-generate",
            [
                "ruler",
                "runs/rope",
                "--lengths",
                "8",
                "--trials",
                "2",
                "--tasks",
                "niah_single_2,fwe",
                "--no-progress",
                "--plot",
                "plots/ruler.png",
            ],
        ),
        (
            "lm-eval",
            [
                "lm-eval",
                "runs/rope",
                "--tasks",
                "behaviour_choice",
                "--include-path",
                str(tasks),
                "--limit",
                "4",
            ],
        ),
        (
            "generate",
            [
                "generate",
                "runs/rope",
                "--prompt",
                "The state of the union",
                "--max-new-tokens",
                "12",
                "--seed",
                "0",
                "--no-progress",
            ],
        ),
        (
            "generate-nocache",
            [
                "generate",
                "runs/expe",
                "--prompt",
                "Congress",
                "--max-new-tokens",
                "8",
                "--seed",
                "1",
                "--no-cache",
                "--no-progress",
            ],
        ),
        ("export-hf", ["export", "runs/rope", "--out", "export/rope-hf"]),
        ("export-remote", ["export", "runs/cable", "--out", "export/cable-remote"]),
        ("compare", ["compare", str(tasks / "sweep.toml"), "--out", "compare", "--no-progress"]),
        ("report", ["report", "compare", "--out", "compare-report", "--baseline", "ALiBi"]),
    ]


SWEEP = """title = "behaviour snapshot"
train = "cpu/tiny"
set = ["train.steps=12", "train.eval_every=0", "train.checkpoint_every=0"]
lengths = [1, 2, 4]
max_eval_tokens = 1024
baseline = "RoPE"
tasks = ["passkey"]
passkey = { trials = 2 }

[[rows]]
name = "RoPE"
positions = { name = "rope" }
[[rows]]
name = "ALiBi"
positions = { name = "alibi" }
"""


def write_inputs(tasks: Path) -> None:
    tasks.mkdir(parents=True, exist_ok=True)
    choices = [" yes", " no", " maybe"]
    docs = [{"question": f"Question {i}:", "choices": choices, "label": i % 3} for i in range(6)]
    (tasks / "choice.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tasks / "behaviour_choice.yaml").write_text(LM_EVAL_TASK.format(dir=tasks))
    (tasks / "sweep.toml").write_text(SWEEP)


def run(out: Path) -> int:
    # one snapshot at a time on a machine: they share WORK (the fixed path that keeps outputs comparable)
    lock = open(f"{WORK}.lock", "w")  # held for the whole run, released at exit
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another behaviour snapshot is running in {WORK}; wait for it to finish.", file=sys.stderr)
        return 2
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    tasks = WORK / "inputs"
    write_inputs(tasks)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        EXTRAPOS_CACHE=str(WORK / "cache"),
        PYTHONHASHSEED="0",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    # the GPT-2 rank file and other tokenizers a command may look for are not needed: cpu/tiny is bpe:8192
    (WORK / "logs").mkdir()
    failed = 0
    for label, argv in commands(tasks):
        proc = subprocess.run(
            [sys.executable, "-m", "extrapos", *argv], cwd=WORK, env=env, capture_output=True, text=True
        )
        log = f"exit {proc.returncode}\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        (WORK / "logs" / f"{label}.txt").write_text(log)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        print(f"{label:24s} {status}", flush=True)
        failed += proc.returncode != 0
    shutil.rmtree(WORK / "cache", ignore_errors=True)  # prepared data: covered by the runs' data.json
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(WORK, out)
    print(f"snapshot in {out} ({failed} command(s) failed; a failure is part of the behaviour compared)")
    return 0


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not TIMING_KEY.search(str(k))}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    if isinstance(value, str):
        return _mask(value)  # sentences that quote a wall time ("sweep wall time 0.5 min")
    return value


def _json_values(path: Path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [_strip(json.loads(line)) for line in text.splitlines() if line.strip()]
    return _strip(json.loads(text))


def _mask(text: str) -> str:
    for pattern, repl in CONSOLE_NOISE:
        text = pattern.sub(repl, text)
    return text


def diff(a: Path, b: Path) -> int:
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    problems = [f"only in {a}: {p}" for p in sorted(files_a - files_b)]
    problems += [f"only in {b}: {p}" for p in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        pa, pb = a / rel, b / rel
        if pa.suffix in (".json", ".jsonl"):
            same = _json_values(pa) == _json_values(pb)
        elif rel.parts[0] == "logs" or pa.suffix == ".md":  # console text and reports quote wall times
            same = _mask(pa.read_text()) == _mask(pb.read_text())
        else:
            same = pa.read_bytes() == pb.read_bytes()
        if not same:
            problems.append(f"differs: {rel}")
    for line in problems:
        print(line)
    print(f"{len(files_a & files_b)} files compared, {len(problems)} difference(s)")
    return 1 if problems else 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        return run(Path(sys.argv[2]).resolve())
    if len(sys.argv) == 4 and sys.argv[1] == "diff":
        return diff(Path(sys.argv[2]), Path(sys.argv[3]))
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
