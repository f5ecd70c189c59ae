"""A comparison's table beside a published one: per row and length the difference, and whether it is within
run-to-run noise; then one line of verdict.

Why a yardstick at all: the same CPU kind with the same torch reproduces a published table to the last digit,
but another CPU kind (AVX2 instead of AVX-512) runs other kernels, whose rounding moves the training
trajectory as another seed does. A 2-core AVX2 EPYC printed five rows of the quick table to the last digit,
CABLE 0.001 lower, and Sinusoidal 0.130 higher at 16x, outside the published interval over documents (which
holds the documents, not training) but inside the spread the three seeds of ``quick-seeds`` measured. So a
cell is judged against the training noise a seeds run of the same sweep measured, and, where a row has no
seeds, against the published 95% interval.

The seeds' noise of a cell: sigma, the sample standard deviation of the per-seed losses (what the seeds
report prints as "mean ± sd"). With three seeds it rests on three numbers, and a cell whose seeds happened to
agree (ExPE at 16x: 0.004 where its other lengths have 0.014-0.019) would call ordinary noise a difference; so
sigma is at least the median over the seeds table's cells. The difference of the user's mean over ``n`` runs
and the published mean over ``m`` runs has the standard deviation ``sigma * sqrt(1/m + 1/n)``; a cell is noise
while the difference is within ``NOISE_SDS`` of those standard deviations of one run (``NOISE_SDS * sigma``
for two single runs), which two runs that differ only by their training noise exceed in about 1 cell of 200
(a normal difference beyond 2.8 of its standard deviations), so a flagged row is worth a look.

``compare_tables`` is the judgement itself, on numbers only (a loss per row and length, a band per cell);
``against_published`` builds them from saved results (a comparison's ``results.json``), leaving out, with a
sentence each, the rows that did not score the same target tokens or the same checkpoint step as the
published ones (another corpus, tokenizer, evaluation budget or training budget: no noise explains those).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extrapos.report import stats

#: how many standard deviations of one run's training noise a difference may reach and still be noise
NOISE_SDS = 4.0
#: the table's rows by name, each its loss by length (ev)
Table = dict[str, dict[int, float]]
MATCHES = "matches the published table within run-to-run noise"


@dataclass(frozen=True)
class Band:
    """The losses of one (row, length) counted as run-to-run noise around the published loss: the published
    loss ± a half-width from the seeds (``seeds``), or the published 95% interval over documents
    (``interval``)."""

    low: float
    high: float
    source: str  # "seeds" | "interval"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def words(self, published: float) -> str:
        if self.source == "seeds":
            return f"±{max(published - self.low, self.high - published):.3f}"
        return f"[{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class CellCheck:
    row: str
    ev: int
    mine: float
    published: float
    band: Band | None  # None: nothing measured the noise of this cell

    @property
    def difference(self) -> float:
        return self.mine - self.published

    @property
    def within(self) -> bool | None:
        return None if self.band is None else self.band.contains(self.mine)

    def words(self) -> str:
        """The cell's difference and its judgement, e.g. ``+0.130 within ±0.699``."""
        if self.band is None:
            return f"{self.difference:+.3f}, no measure of noise"
        inside = "within" if self.within else "beyond" if self.band.source == "seeds" else "outside"
        return f"{self.difference:+.3f} {inside} {self.band.words(self.published)}"


@dataclass(frozen=True)
class Comparison:
    cells: list[CellCheck]
    notes: list[str]  # what was not compared, one sentence each

    @property
    def beyond(self) -> list[CellCheck]:
        return [c for c in self.cells if c.within is False]

    def verdict(self) -> str:
        """One line: ``MATCHES`` when every judged cell is within noise, else each row beyond it with its
        lengths, losses and bands."""
        judged = [c for c in self.cells if c.within is not None]
        if not judged:
            why = (
                "the reasons are above"
                if self.notes
                else "nothing measured their noise: no seeds, and no interval over the published documents"
            )
            return f"no cell of this table could be judged against the published one ({why})"
        rows: dict[str, list[CellCheck]] = {}
        for c in self.beyond:
            rows.setdefault(c.row, []).append(c)
        if not rows:
            partial = self.notes or len(judged) < len(self.cells)
            return MATCHES + (
                " in the cells that could be judged (the others are named above)" if partial else ""
            )
        return "; ".join(
            f"row {row} differs beyond noise at "
            + " and ".join(f"{c.ev}x ({c.mine:.3f} against {c.published:.3f}: {c.words()})" for c in cells)
            for row, cells in rows.items()
        )


def compare_tables(mine: Table, published: Table, bands: Mapping[tuple[str, int], Band]) -> Comparison:
    """Every (row, length) the two tables share, judged by its band; rows and lengths only one table holds
    are named in the notes."""
    cells, notes = [], []
    for row, losses in mine.items():
        if row not in published:
            notes.append(f"row {row} is not in the published table.")
            continue
        for ev, loss in losses.items():
            if ev in published[row]:
                cells.append(CellCheck(row, ev, loss, published[row][ev], bands.get((row, ev))))
        missing = sorted(set(published[row]) - set(losses))
        if missing:
            notes.append(f"row {row} was not scored at {', '.join(f'{k}x' for k in missing)}.")
    absent = [row for row in published if row not in mine]
    if absent:
        notes.append(f"published rows not in this table: {', '.join(absent)}.")
    return Comparison(cells, notes)


def loss_table(results: list[dict[str, Any]]) -> Table:
    """row -> ev -> mean token loss of a comparison's ``results.json`` (the mean over seeds where it has
    several); a NaN stays, to be judged beyond every band, and only a cell without a loss is left out."""
    return {
        r["name"]: {c["ev"]: c["loss"] for c in r["results"] if c.get("loss") is not None} for r in results
    }


def against_published(
    mine: list[dict[str, Any]],
    published: list[dict[str, Any]],
    seeds: list[dict[str, Any]] | None = None,
) -> Comparison:
    """The user's results beside the published ones, each cell judged by the seeds' noise (the published
    rows' own seeds, else the rows of ``seeds``, a seeds run of the same sweep) or the published interval."""
    by_name = {r["name"]: r for r in published}
    kept, notes = [], []
    for row in mine:
        reason = _not_comparable(row, by_name[row["name"]]) if row["name"] in by_name else None
        if reason:
            notes.append(f"row {row['name']} is not compared: {reason}.")
        else:
            kept.append(row)
    left = {r["name"] for r in mine} - {r["name"] for r in kept}
    table = {name: losses for name, losses in loss_table(published).items() if name not in left}
    comparison = compare_tables(loss_table(kept), table, noise_bands(kept, published, seeds))
    return Comparison(comparison.cells, notes + comparison.notes)


def noise_bands(
    mine: list[dict[str, Any]],
    published: list[dict[str, Any]],
    seeds: list[dict[str, Any]] | None = None,
) -> dict[tuple[str, int], Band]:
    """(row, ev) -> the band of losses that is noise around the published loss, for the rows of ``mine``."""
    sigmas = _seed_sigmas(published, seeds)
    floor = statistics.median(sigmas.values()) if sigmas else 0.0
    by_name = {r["name"]: r for r in published}
    bands = {}
    for row in mine:
        pub = by_name.get(row["name"])
        if pub is None:
            continue
        runs = (len(pub.get("seeds") or []) or 1, len(row.get("seeds") or []) or 1)
        for cell in pub["results"]:
            ev, loss = cell["ev"], cell.get("loss")
            if not _finite(loss):
                continue
            sigma = sigmas.get((row["name"], ev))
            if sigma is not None:
                # NOISE_SDS sigmas for two single runs; the means of m and n runs differ by less
                half = NOISE_SDS * max(sigma, floor) * math.sqrt((1 / runs[0] + 1 / runs[1]) / 2)
                bands[(row["name"], ev)] = Band(loss - half, loss + half, "seeds")
                continue
            interval, _ = stats.length_interval(pub, ev)
            if interval is not None:
                bands[(row["name"], ev)] = Band(interval.low, interval.high, "interval")
    return bands


def _seed_sigmas(
    published: list[dict[str, Any]], seeds: list[dict[str, Any]] | None
) -> dict[tuple[str, int], float]:
    """(row, ev) -> the sample standard deviation of the per-seed losses, from a published row's own seeds or
    else the seeds table's row of the same name, where that scored the same target tokens."""
    extra = {r["name"]: r for r in seeds or []}
    sigmas = {}
    for pub in published:
        source = pub if len(pub.get("seeds") or []) > 1 else extra.get(pub["name"])
        if source is None or len(source.get("seeds") or []) < 2:
            continue
        for cell in pub["results"]:
            ev = cell["ev"]
            if _targets(source, ev) != _targets(pub, ev):
                continue  # another evaluation's noise says nothing of this one
            values = [_loss(part, ev) for part in source["seeds"]]
            if all(_finite(v) for v in values):
                sigmas[(pub["name"], ev)] = statistics.stdev(v for v in values if v is not None)
    return sigmas


def _not_comparable(mine: dict[str, Any], published: dict[str, Any]) -> str | None:
    """Why a row's losses cannot be set beside the published row's (no training noise explains it), or
    None."""
    for cell in mine["results"]:
        theirs, ours = _targets(published, cell["ev"]), cell.get("targets")
        if theirs and ours and theirs != ours:
            return (
                f"it scored other target tokens at {cell['ev']}x than the published row (another corpus, "
                "tokenizer or evaluation budget)"
            )
    steps = mine.get("checkpoint_step"), published.get("checkpoint_step")
    if None not in steps and steps[0] != steps[1]:
        return (
            f"it was scored at step {steps[0]}, the published row at step {steps[1]} "
            "(another training budget)"
        )
    encodings = mine.get("encoding"), published.get("encoding")
    if None not in encodings and encodings[0] != encodings[1]:
        return f"it is {encodings[0]}, the published row {encodings[1]}"
    return None


def render(comparison: Comparison, published_name: str, seeds_name: str | None = None) -> str:
    """A Markdown table of the user's losses, each with its difference to the published one and its band,
    beyond-noise cells in bold; the notes; then the verdict line."""
    lengths = sorted({c.ev for c in comparison.cells})
    sources = {c.band.source for c in comparison.cells if c.band is not None}
    yardsticks = []
    if "seeds" in sources:
        runs = f"the seeds of {seeds_name}" if seeds_name else "the published rows' own seeds"
        yardsticks.append(f"±{NOISE_SDS:g} standard deviations of one run over {runs}")
    if "interval" in sources:
        yardsticks.append(
            "the published 95% interval over documents where a row has no seeds"
            if "seeds" in sources
            else "the published 95% interval over documents: no seeds measured the training noise"
        )
    lines = [
        f"Your table beside the published one ({published_name}): your loss, its difference to the published "
        "loss, and the run-to-run noise it is judged against"
        + (f" ({', or '.join(yardsticks)})." if yardsticks else "."),
        "",
    ]
    if lengths:
        lines += ["| model | " + " | ".join(f"ev={k}" for k in lengths) + " |"]
        lines += ["|---|" + "---:|" * len(lengths)]
        rows: dict[str, dict[int, CellCheck]] = {}
        for c in comparison.cells:
            rows.setdefault(c.row, {})[c.ev] = c
        for row, cells in rows.items():
            text = []
            for k in lengths:
                cell = cells.get(k)
                if cell is None:
                    text.append("–")
                    continue
                words = f"{cell.mine:.3f} ({cell.words()})"
                text.append(f"**{words}**" if cell.within is False else words)
            lines.append(f"| {row} | " + " | ".join(text) + " |")
        lines.append("")
    lines += comparison.notes + ([""] if comparison.notes else [])
    lines.append(f"Verdict: {comparison.verdict()}.")
    return "\n".join(lines)


def _targets(result: dict[str, Any], ev: int) -> str | None:
    return next((c.get("targets") for c in result["results"] if c["ev"] == ev), None)


def _loss(result: dict[str, Any], ev: int) -> float | None:
    return next((c.get("loss") for c in result["results"] if c["ev"] == ev), None)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
