"""How `train` starts on a run directory (training/start.py): a table of cases on facts written in memory, and
the facts as read from a directory. Nothing trains here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from extrapos.run.config import load_config
from extrapos.training.start import Kind, RunDirectoryFacts, Saved, Start, decide

RUN = Path("runs/r")
CFG = load_config("cpu/tiny")
SAVED = load_config("cpu/tiny", ["train.steps=8"])
MORE = load_config("cpu/tiny", ["train.steps=12"])


@dataclasses.dataclass
class Facts:
    """A run directory's facts as ``decide`` reads them; ``read`` records which it asked for."""

    holds_run: bool = True
    inside_run: str = ""
    stopped_early: bool = False
    compared: Saved = dataclasses.field(default_factory=lambda: Saved(SAVED))
    complete: bool = False
    unusable: str = ""
    run_dir: Path = RUN
    read: list[str] = dataclasses.field(default_factory=list)

    def __getattribute__(self, name: str):
        if name in ("holds_run", "inside_run", "stopped_early", "complete", "unusable"):
            object.__getattribute__(self, "read").append(name)
        return object.__getattribute__(self, name)

    def saved(self, cfg):
        self.read.append("saved")
        return self.compared


ALREADY = f"{RUN} already holds a run; pass --resume to continue it or choose another --out."
NO_RUN = f"{RUN} holds no run to resume; start it with --config FILE_OR_PRESET."
INSIDE = "--out runs/r is inside the run runs, whose ...; choose a path outside the run."
CHANGE = "runs/r was trained with model.d_model = 64; --resume cannot change it to 128; ..."
UNUSABLE = "runs/r is finished but has no usable checkpoint left: it holds no checkpoint, so ..."

# (facts, config given, --resume) -> the start, and the facts read to decide it
CASES = {
    "a new run": (Facts(holds_run=False), CFG, False, Start(Kind.FRESH, CFG), ["holds_run", "inside_run"]),
    "--resume of no run with a config starts it": (
        Facts(holds_run=False),
        CFG,
        True,
        Start(Kind.FRESH, CFG),
        ["holds_run", "inside_run"],
    ),
    "--out inside another run": (
        Facts(holds_run=False, inside_run=INSIDE),
        None,
        True,
        Start(Kind.REFUSE, refusal=INSIDE),
        ["holds_run", "inside_run"],
    ),
    "--resume of no run without a config": (
        Facts(holds_run=False),
        None,
        True,
        Start(Kind.REFUSE, refusal=NO_RUN),
        ["holds_run", "inside_run"],
    ),
    "stopped before its first checkpoint: started over": (
        Facts(stopped_early=True),
        CFG,
        False,
        Start(Kind.RESTART, CFG),
        ["holds_run", "stopped_early"],
    ),
    "stopped early, --resume too: started over": (
        Facts(stopped_early=True),
        CFG,
        True,
        Start(Kind.RESTART, CFG),
        ["holds_run", "stopped_early"],
    ),
    "stopped early, resumed with its own config: resumed (a restart needs a config)": (
        Facts(stopped_early=True),
        None,
        True,
        Start(Kind.RESUME, SAVED),
        ["holds_run", "saved", "complete"],
    ),
    "a run there, no --resume": (
        Facts(),
        CFG,
        False,
        Start(Kind.REFUSE, refusal=ALREADY),
        ["holds_run", "stopped_early"],
    ),
    "a run there, no --resume, no config": (
        Facts(),
        None,
        False,
        Start(Kind.REFUSE, refusal=ALREADY),
        ["holds_run"],
    ),
    "--resume changing what is learned": (
        Facts(compared=Saved(refusal=CHANGE)),
        CFG,
        True,
        Start(Kind.REFUSE, refusal=CHANGE),
        ["holds_run", "stopped_early", "saved"],
    ),
    "--resume of a finished run with its budget": (
        Facts(complete=True),
        None,
        True,
        Start(Kind.COMPLETE, SAVED),
        ["holds_run", "saved", "complete", "unusable"],
    ),
    "--resume of a finished run without a checkpoint": (
        Facts(complete=True, unusable=UNUSABLE),
        None,
        True,
        Start(Kind.REFUSE, refusal=UNUSABLE),
        ["holds_run", "saved", "complete", "unusable"],
    ),
    "--resume of a finished run with a larger budget: trained further, its checkpoints not read": (
        Facts(complete=True, compared=Saved(MORE, ("train.steps 8 -> 12",))),
        MORE,
        True,
        Start(Kind.RESUME, MORE, ("train.steps 8 -> 12",)),
        ["holds_run", "stopped_early", "saved"],
    ),
    "--resume of a partial run": (
        Facts(),
        CFG,
        True,
        Start(Kind.RESUME, SAVED),
        ["holds_run", "stopped_early", "saved", "complete"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decide(case):
    facts, cfg, resume, expected, read = CASES[case]
    assert decide(facts, cfg, resume) == expected
    assert facts.read == read  # asked in the order the refusals come, nothing more


def test_the_trainer_continues_every_start_but_a_fresh_one():
    assert [k for k in Kind if Start(k).resume] == [Kind.RESTART, Kind.RESUME, Kind.COMPLETE]


def write_run(run_dir: Path, cfg=SAVED, **files: str) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(cfg.to_toml())
    for name, text in files.items():
        (run_dir / name.replace("_", ".")).write_text(text)
    return run_dir


def test_the_facts_of_a_directory(tmp_path):
    empty = RunDirectoryFacts(tmp_path / "new")
    assert not empty.holds_run and empty.inside_run == ""
    inside = RunDirectoryFacts(write_run(tmp_path / "a", summary_json="{}") / "checkpoints" / "x")
    assert "is inside the run" in inside.inside_run

    started = RunDirectoryFacts(write_run(tmp_path / "b"))  # config.toml and nothing trained yet
    assert started.holds_run and started.stopped_early and not started.complete
    assert decide(started, SAVED, resume=False).kind is Kind.RESTART

    logged = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6))
    trained = RunDirectoryFacts(write_run(tmp_path / "c", metrics_jsonl=logged, summary_json="{}"))
    assert not trained.stopped_early and trained.complete
    assert trained.saved(None) == Saved(SAVED)
    assert trained.saved(SAVED) == Saved(SAVED)
    assert trained.saved(MORE) == Saved(MORE, ("train.steps 8 -> 12",))
    wider = trained.saved(load_config("cpu/tiny", ["train.steps=8", "model.d_model=128"]))
    assert (
        wider.cfg is None
        and "--resume cannot change it" in wider.refusal
        and "model.d_model" in wider.refusal
    )
    assert trained.unusable.startswith(f"{trained.run_dir} is finished but has no usable checkpoint left")
    assert decide(trained, None, resume=True) == Start(Kind.REFUSE, refusal=trained.unusable)
    assert decide(trained, MORE, resume=True) == Start(Kind.RESUME, MORE, ("train.steps 8 -> 12",))
