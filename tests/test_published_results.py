"""The published numbers cannot go stale unnoticed.

1. Every Markdown table in README.md and docs/results/ that copies a table of a committed report (a page
   that links into a report's folder, with a table of the same header) has, row for row, the report's
   numbers; and every loss in a report's main table is its results.json's loss, rounded as printed.
2. Each committed sweep report's request (the targets key: lengths, protocol, boundary, selection, token
   budget) is what its preset requests today, so a change of defaults cannot leave a table behind that its
   command no longer produces. Reports made before such a change are listed in ``STALE`` with the reason;
   the list may only shrink (a test fails when an entry is fixed but still listed).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from extrapos.report.number_guard import pages

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
#: the pages the number guard reads (a table under its "table from" marker is checked here)
PAGES = pages(ROOT)

#: committed sweep reports and the preset whose command made them
PRESETS = {
    "quick": "quick",
    "quick-seeds": "quick-seeds",
    "quick-precision": "quick-precision",
    "medium": "medium",
    "medium-seeds": "medium-seeds",
    "medium-seeds-others": "medium-seeds-others",
    "extension-methods": "extension-methods",
    "rehearsal": "rehearsal",
    "rehearsal-mask": "rehearsal-mask",
    "expe-table2": "expe-table2",
    "gpu-first-table": "gpu/first-table",  # `make gpu-run` on an H200 (its compare stage)
    "sinusoidal": None,  # a hand-made comparison of two forms (its page gives the commands), no preset
}
#: reports whose request differs from what their preset asks today, each with why (until re-run)
STALE = {
    "expe-table2": "its Sinusoidal row was scored with the older first-documents selection",
}


def _cells(line: str) -> list[str]:
    """A row's cells, without bold and without the number guard's markers (HTML comments)."""
    line = re.sub(r"<!--.*?-->", "", line)
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[tuple[tuple[str, ...], dict[str, list[str]]]]:
    """Every Markdown table: (header cells, {first cell: row cells})."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            header = tuple(_cells(lines[i]))
            rows = {}
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = _cells(lines[i])
                rows[cells[0]] = cells
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def linked_reports(page: Path) -> set[Path]:
    """The committed reports a page links into: any link to a path inside a folder that holds report.md."""
    found = set()
    for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
        path = (page.parent / target).resolve()
        for folder in (path, *path.parents):
            if folder == ROOT or ROOT not in folder.parents:
                break
            if (folder / "report.md").is_file():
                found.add(folder / "report.md")
                break
    return found


def _same_row(cells: list[str], source: list[str]) -> bool:
    """Equal cells; a page may join a second number to a cell ("0.491 [0.466, 0.516] / 0.008": accuracy
    and exact match side by side), which then starts with the report's cell."""
    return len(cells) == len(source) and all(a == b or a.startswith(b + " / ") for a, b in zip(cells, source))


def page_mismatches(page: Path) -> tuple[list[str], int]:
    """(the rows of ``page`` whose cells differ from the linked report's row of the same table, the number
    of rows compared)."""
    report_tables = [t for report in linked_reports(page) for t in tables(report.read_text())]
    bad, checked = [], 0
    for header, rows in tables(page.read_text()):
        sources = [r for h, r in report_tables if h == header]
        if not sources:
            continue
        for name, cells in rows.items():
            candidates = [r[name] for r in sources if name in r]  # a page may link several reports
            if not candidates:
                continue
            checked += 1
            if not any(_same_row(cells, source) for source in candidates):
                where = f"{page.relative_to(ROOT)}: row {name!r}"
                bad.append(f"{where} is {cells[1:]}, its report has {candidates[0][1:]}")
    return bad, checked


def test_the_checker_finds_a_changed_number(tmp_path, monkeypatch):
    """A copy of a report table with one digit changed is caught; the unchanged copy passes."""
    folder = tmp_path / "docs" / "results" / "x"
    folder.mkdir(parents=True)
    (folder / "report.md").write_text("| model | ev=1 |\n|---|---:|\n| RoPE | **5.076** [5.0, 5.1] |\n")
    page = tmp_path / "docs" / "results" / "x.md"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page.write_text("[r](x/report.md)\n\n| model | ev=1 |\n|---|---:|\n| RoPE | 5.076 [5.0, 5.1] |\n")
    assert page_mismatches(page) == ([], 1)
    page.write_text("[r](x/report.md)\n\n| model | ev=1 |\n|---|---:|\n| RoPE | 5.077 [5.0, 5.1] |\n")
    bad, checked = page_mismatches(page)
    assert checked == 1 and len(bad) == 1 and "5.077" in bad[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_published_tables_equal_their_reports(page):
    bad, _ = page_mismatches(page)
    assert not bad, "\n".join(bad)


def test_the_readme_headline_is_checked():
    """The README's headline table copies the quick report's table, all seven rows of it."""
    _, checked = page_mismatches(ROOT / "README.md")
    assert checked >= 7


def _loss_table(report: Path) -> tuple[tuple[str, ...], dict[str, list[str]]] | None:
    """The report's first table of loss per length (model | ev=... columns)."""
    return next(
        (
            t
            for t in tables(report.read_text())
            if t[0][0] == "model" and all(h.startswith("ev=") for h in t[0][1:])
        ),
        None,
    )


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in RESULTS.glob("*/results.json")))
def test_report_losses_are_their_results(folder):
    """Each loss printed in a report's main table is the results file's, rounded as printed."""
    report = RESULTS / folder / "report.md"
    results = json.loads((RESULTS / folder / "results.json").read_text())
    table = _loss_table(report) if report.is_file() else None
    if table is None or not isinstance(results, list):
        pytest.skip(f"{folder} has no per-row loss table over lengths")
    header, rows = table
    by_name = {r["name"]: r for r in results if isinstance(r, dict) and "name" in r}
    checked = 0
    for name, cells in rows.items():
        result = by_name.get(name)
        if result is None:
            continue
        losses = {r["ev"]: r["loss"] for r in result.get("results", [])}
        for column, cell in zip(header[1:], cells[1:]):
            ev = float(column.removeprefix("ev="))
            ev_key = next((k for k in losses if float(k) == ev), None)
            number = re.match(r"^\s*([0-9.]+)", cell)
            if ev_key is None or number is None:
                continue
            digits = len(number.group(1).split(".")[1]) if "." in number.group(1) else 0
            assert number.group(1) == f"{losses[ev_key]:.{digits}f}", (folder, name, column)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("folder", sorted(f for f, preset in PRESETS.items() if preset))
def test_committed_reports_request_what_their_preset_requests_today(folder):
    from extrapos.compare import load_sweep

    sweep = load_sweep(PRESETS[folder])  # type: ignore[arg-type]
    results = {r["name"]: r for r in json.loads((RESULTS / folder / "results.json").read_text())}
    differ = []
    for row in sweep.rows:
        result = results.get(row.name)
        if result is not None:
            # the seeds trained: a one-seed table under a three-seed preset understates the noise it reports
            seeds = result.get("seeds") or [None]
            if sweep.seeds and len(seeds) != len(sweep.seeds):
                differ.append(f"{row.name}: {len(seeds)} seed(s), the preset asks {len(sweep.seeds)}")
        if result is None or row.extend is not None or not result.get("request"):
            continue  # extension rows are scored per factor (their request is checked through the parent)
        if sweep.eval_each_length:
            continue
        want = sweep.eval_request(sweep.lengths, row.eval, sweep.max_eval_tokens, ran_in(sweep, folder))
        got = result["request"]
        for field in ("lengths", "max_tokens", "protocol", "boundary", "selection", "split", "precision"):
            w, g = getattr(want, field, None), got.get(field, DEFAULTS.get(field))
            if w != g:
                differ.append(f"{row.name}: {field} {g!r}, the preset asks {w!r}")
    if folder in STALE:
        assert differ, f"{folder} now requests what its preset asks: remove it from STALE"
        pytest.skip(f"{folder}: {STALE[folder]}")
    assert not differ, f"docs/results/{folder} is stale: " + "; ".join(differ)


def ran_in(sweep, folder: str) -> str:
    """The precision the preset's ``eval_precision`` meant where the report was made: "auto" is bf16 on a
    CUDA device (budget.json names it, "cpu" otherwise; every GPU lent here has bf16), fp32 on a CPU."""
    if sweep.eval_precision != "auto":
        return sweep.eval_precision
    budget = RESULTS / folder / "budget.json"
    device = json.loads(budget.read_text()).get("device", "") if budget.is_file() else ""
    return "fp32" if device in ("", "cpu") else "bf16"


#: a request saved before a field existed holds the value that reproduces it (docs/evaluation.md)
DEFAULTS = {"protocol": "documents", "boundary": None, "selection": "first", "precision": "fp32"}


def test_the_h200_step_times_in_prose_are_the_probes():
    """The first GPU session's step times, as distributed.md and h200-first.md print them, are the budget
    probe's in docs/results/gpu/h200-first/compare.json (an edit to either fails here; the README's GPU
    numbers are the second session's, tied by the number guard's markers)."""
    root = RESULTS.parent.parent
    probe = json.loads((RESULTS / "gpu" / "h200-first" / "compare.json").read_text())["budget"]["probe"]
    ms = {r["row"]: r["step_seconds"] * 1000 for r in probe["rows"]}
    assert set(ms) == {"NoPE", "RoPE", "ALiBi", "CABLE", "ExPE"}
    page = (RESULTS / "gpu" / "h200-first.md").read_text()
    for row, value in ms.items():
        assert f"| {row} | {value:.1f} |" in page, row
    distributed = " ".join((root / "docs" / "distributed.md").read_text().split())
    assert f"took {ms['NoPE']:.0f} ms for NoPE, {ms['ExPE']:.0f} ExPE, {ms['RoPE']:.0f} RoPE" in distributed


# ---- training settings: a preset cannot drift from the table it published --------------------------------

_MODEL_FACT = re.compile(
    r"^- model: (?P<flavour>\w+), (?P<layers>\d+) layers, d=(?P<d>\d+), (?P<heads>\d+) heads"
)
_DATA_FACT = re.compile(r"^- data: corpus (?P<corpus>\S+), tokenizer (?P<tokenizer>[^;,\s]+)")
_TRAINING_FACT = re.compile(
    r"^- training: L_t=(?P<lt>\d+), (?P<tokens>[\d,]+(?:, [\d,]+)*) tokens per model, batch (?P<batch>\d+), "
    r"lr (?P<lr>\S+) -> (?P<end_lr>\S+), (?P<precision>.+), (?P<seeds>seeds? [\d, ]+)$"
)


def training_mismatches(sweep, report: str, results: list[dict]) -> list[str]:
    """How the training settings ``sweep`` asks today differ from those the committed ``report`` states (its
    facts, written from the runs' configs and summaries) and the rows ``results`` holds: the model's
    flavour, layers, width and heads, L_t, the tokens per model, batch, learning rates, precision, seeds and
    the rows themselves, the corpus and tokenizer."""
    from extrapos.compare.sweep import row_config

    model = next((m for m in map(_MODEL_FACT.match, report.splitlines()) if m), None)
    training = next((m for m in map(_TRAINING_FACT.match, report.splitlines()) if m), None)
    if model is None or training is None:
        return ["the report states no model or training line to compare"]
    differ = []
    trained = [r for r in sweep.rows if not r.reuse and r.extend is None and r.run is None]
    for row in trained:
        cfg = row_config(sweep, row, [])
        m, t = cfg.model, cfg.train
        want = {
            "model": (m.flavour, m.n_layers, m.d_model, m.n_heads),
            "L_t": cfg.seq_len,
            "batch": t.batch_size,
            "lr": (f"{t.lr:g}", f"{t.end_lr:g}"),
        }
        got = {
            "model": (model["flavour"], int(model["layers"]), int(model["d"]), int(model["heads"])),
            "L_t": int(training["lt"]),
            "batch": int(training["batch"]),
            "lr": (training["lr"], training["end_lr"]),
        }
        differ += [
            f"{row.name}: {k} {got[k]!r}, the preset asks {w!r}" for k, w in want.items() if got[k] != w
        ]
        data = next((d for d in map(_DATA_FACT.match, report.splitlines()) if d), None)
        if data is None or (data["corpus"], data["tokenizer"]) != (
            str(cfg.data.corpus),
            str(cfg.data.tokenizer),
        ):
            shown = "none" if data is None else f"{data['corpus']} ({data['tokenizer']})"
            differ.append(
                f"{row.name}: corpus {shown}, the preset asks {cfg.data.corpus} ({cfg.data.tokenizer})"
            )
        if (
            t.precision != "auto"
            and "/" not in training["precision"]
            and t.precision != training["precision"]
        ):
            differ.append(f"{row.name}: precision {training['precision']}, the preset asks {t.precision}")
        if sweep.budget_seconds is None and t.tokens is not None:
            # a run trains whole steps: the tokens asked, rounded up to a step of batch x L_t tokens
            step = t.batch_size * cfg.seq_len
            counts = [int(x.replace(",", "")) for x in training["tokens"].split(", ")]
            if not all(t.tokens <= n < t.tokens + step for n in counts):
                differ.append(
                    f"{row.name}: {training['tokens']} tokens per model, the preset asks {t.tokens:,}"
                )
    seeds = f"seeds {', '.join(map(str, sweep.seeds))}" if sweep.seeds else None
    if seeds is not None and training["seeds"] != seeds:
        differ.append(f"{training['seeds']}, the preset asks {seeds}")
    if (
        seeds is None
        and trained
        and training["seeds"] != f"seed {row_config(sweep, trained[0], []).train.seed}"
    ):
        differ.append(
            f"{training['seeds']}, the preset asks seed {row_config(sweep, trained[0], []).train.seed}"
        )
    names, published = [r.name for r in sweep.rows], [r["name"] for r in results]
    if sorted(names) != sorted(published):
        differ.append(f"rows {published}, the preset has {names}")
    return differ


@pytest.mark.parametrize("folder", sorted(f for f, preset in PRESETS.items() if preset))
def test_committed_reports_trained_what_their_preset_trains_today(folder):
    """A change to a preset's model, tokens, learning rate, seeds or rows fails here until its table is run
    again (or the change undone): the committed table would no longer be what its command produces."""
    from extrapos.compare import load_sweep

    differ = training_mismatches(
        load_sweep(PRESETS[folder]),  # type: ignore[arg-type]
        (RESULTS / folder / "report.md").read_text(),
        json.loads((RESULTS / folder / "results.json").read_text()),
    )
    assert not differ, f"docs/results/{folder} was trained otherwise than its preset asks: " + "; ".join(
        differ
    )


@pytest.mark.parametrize(
    "edit, expect",
    [
        (("train.tokens=800_000", "train.tokens=900_000"), "tokens per model"),
        (('"train.eval_every=0"', '"train.eval_every=0", "train.lr=0.003"'), "lr"),
        (('"train.eval_every=0"', '"model.d_model=256"'), "model"),
        (('"train.eval_every=0"', '"train.seq_len=128"'), "L_t"),
        (('baseline = "RoPE"', 'baseline = "RoPE"\nseeds = [0, 1]'), "seeds 0, 1"),
        (
            (
                'name = "ExQPE"\npositions = { name = "exqpe" }',
                'name = "XPos"\npositions = { name = "xpos" }',
            ),
            "rows",
        ),
    ],
    ids=["tokens", "lr", "width", "L_t", "seeds", "a row"],
)
def test_a_preset_changed_after_its_table_fails_the_settings_check(tmp_path, edit, expect):
    """A copy of the quick preset with one training setting changed no longer matches the committed quick
    table; the unchanged copy does."""
    from extrapos.compare import load_sweep
    from extrapos.compare.sweep import find_sweep

    text = find_sweep("quick").read_text()
    report = (RESULTS / "quick" / "report.md").read_text()
    results = json.loads((RESULTS / "quick" / "results.json").read_text())
    (tmp_path / "same.toml").write_text(text)
    assert training_mismatches(load_sweep(str(tmp_path / "same.toml")), report, results) == []
    assert edit[0] in text
    (tmp_path / "changed.toml").write_text(text.replace(edit[0], edit[1]))
    differ = training_mismatches(load_sweep(str(tmp_path / "changed.toml")), report, results)
    assert differ and any(expect in d for d in differ), differ


#: presets whose committed report has task columns only (``loss = false``): no results.json, rows in rows.json
TASK_PRESETS = {"ruler": "ruler", "ruler-medium": "ruler-medium"}
#: task-only reports kept after their preset changed (the run they record, no longer what the preset trains):
#: rendered again like the others, not compared with a preset
ARCHIVED_TASK_REPORTS = ["ruler-medium/batch16-lr2e-3"]
TASK_REPORTS = sorted(TASK_PRESETS) + ARCHIVED_TASK_REPORTS


@pytest.mark.parametrize("folder", sorted(TASK_PRESETS))
def test_committed_task_reports_trained_what_their_preset_trains_today(folder):
    """The training check of the loss tables, for a report of task columns only; a copy of the preset with
    its corpus changed (2-digit values, as ruler-medium was first set) fails it."""
    from extrapos.compare import load_sweep

    report = (RESULTS / folder / "report.md").read_text()
    rows = json.loads((RESULTS / folder / "rows.json").read_text())
    assert training_mismatches(load_sweep(TASK_PRESETS[folder]), report, rows) == []


def test_a_task_preset_changed_after_its_report_fails_the_settings_check(tmp_path):
    from extrapos.compare import load_sweep
    from extrapos.compare.sweep import find_sweep

    text = find_sweep("ruler-medium").read_text()
    report = (RESULTS / "ruler-medium" / "report.md").read_text()
    rows = json.loads((RESULTS / "ruler-medium" / "rows.json").read_text())
    assert "min_length=180,digits=3," in text
    (tmp_path / "changed.toml").write_text(
        text.replace("min_length=180,digits=3,", "min_length=180,digits=2,")
    )
    differ = training_mismatches(load_sweep(str(tmp_path / "changed.toml")), report, rows)
    assert differ and all("corpus synthetic:ruler:length=256,min_length=180,digits=3" in d for d in differ)


def _task_rows(folder: str) -> list[tuple[str, str]]:
    return [
        (folder, Path(row["tasks"]["ruler"]).stem)
        for row in json.loads((RESULTS / folder / "rows.json").read_text())
    ]


@pytest.mark.parametrize("folder, row", [fr for folder in TASK_REPORTS for fr in _task_rows(folder)])
def test_the_ruler_row_pages_are_what_their_results_render(folder, row):
    """docs/results/FOLDER/ROW.md (the per-task grids with intervals, the needle depth tables, the copiers
    beside each cell) is ``extrapos ruler``'s rendering of the row's committed result."""
    from extrapos.tasks.ruler_report import format_all

    result = json.loads((RESULTS / folder / "tasks" / "ruler" / f"{row}.json").read_text())
    assert (RESULTS / folder / f"{row}.md").read_text() == format_all(result) + "\n"


@pytest.mark.parametrize("folder", TASK_REPORTS)
def test_a_committed_task_report_is_what_extrapos_report_renders_from_its_folder(folder, tmp_path):
    """``extrapos report`` on a copy of the committed folder (rows.json, tasks/, facts.json, report.json;
    no run, no model) writes its report.md byte for byte: no number of a task report can drift from the
    results it reads, and the bootstrap intervals are recomputed, not copied."""
    import shutil

    from extrapos.cli import main

    copy = tmp_path / Path(folder).name
    shutil.copytree(RESULTS / folder, copy)
    (copy / "report.md").unlink()
    assert main(["report", str(copy)]) == 0
    assert (copy / "report.md").read_text() == (RESULTS / folder / "report.md").read_text()


def test_the_figure3_table_is_what_its_attention_results_render():
    """The segmented-figure3 page's table is copied from median-weight.md (its number guard marker says so);
    that table is what the three committed attention results render today."""
    from extrapos.report.attention_figure import check_comparable, summary_table

    folder = RESULTS / "segmented-figure3"
    labels = {"parent": "parent (RoPE)", "chunk": "chunk-0.25 x4", "continue": "continue"}
    results = [(label, json.loads((folder / f"{name}.json").read_text())) for name, label in labels.items()]
    assert summary_table(results, check_comparable(results)) in (folder / "median-weight.md").read_text()


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in RESULTS.glob("*/pairs.md")))
def test_a_pairs_file_is_what_its_results_render(folder):
    """A folder's pairs.md (the paired differences between rows other than the report's baseline, which
    the pages quote) holds, under each "Difference to X:", the difference table its results.json renders
    with X as the baseline."""
    from extrapos.report import render

    text = (RESULTS / folder / "pairs.md").read_text()
    results = json.loads((RESULTS / folder / "results.json").read_text())
    rows = [render.Row(r["name"], r) for r in results]
    baselines = re.findall(r"^Difference to (.+):$", text, flags=re.M)
    assert baselines
    for baseline in baselines:
        table = render.difference_table(rows, render.cell_intervals(rows, baseline))
        assert f"Difference to {baseline}:\n\n{table}\n" in text, baseline


#: an absolute path of a machine: a root folder that holds checkouts, caches, virtual environments or scratch
_MACHINE_PATH = re.compile(r"(?<![\w.$~/-])/(?:work|tmp|root|home|opt|mnt|var|srv|Users)/[\w.-]")


def test_no_committed_page_or_log_under_results_names_a_machines_absolute_path():
    """Every .md and .log file under docs/results names paths relative to the checkout, or as $EXTRAPOS_CACHE,
    $VENV, $TMPDIR or $OUT: a path of the machine that ran it means nothing in another clone (issue 47)."""
    files = sorted([*RESULTS.rglob("*.md"), *RESULTS.rglob("*.log")])
    assert len(files) >= 60
    found = [
        f"{f.relative_to(ROOT)}:{i}: {m.group(0)}"
        for f in files
        for i, line in enumerate(f.read_text().splitlines(), 1)
        for m in _MACHINE_PATH.finditer(line)
    ]
    assert not found, "absolute paths (write them relative to the checkout):\n" + "\n".join(found)
    assert _MACHINE_PATH.search("extrapos from /work/main/src/extrapos") and not _MACHINE_PATH.search(
        "extrapos from src/extrapos, $VENV/bin/python3, docs/results/x"
    )
