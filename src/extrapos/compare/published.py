"""Where a comparison preset's published table lives, and the last thing `extrapos compare` prints: the user's
table beside it, judged by run-to-run noise (``extrapos.report.against_published``).

A published table is the ``results.json`` that ``extrapos compare PRESET`` wrote, committed as
``docs/results/PRESET/results.json`` of the repository; a seeds run of the same sweep, where one was
published, is ``docs/results/PRESET-seeds/results.json`` beside it (``quick-seeds`` for ``quick``) and
measures the noise. The files live in the repository, not in the package: an editable install (`make setup`,
``pip install -e .``) finds them in its checkout, a pip-installed one has none and is told so in one sentence
(``--against FILE`` names a copy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.report.against_published import against_published, render

#: presets whose table the repository publishes in docs/results/<preset>/ (a test keeps it in step)
PUBLISHED = (
    "expe-ablation",
    "expe-ablation-code",
    "expe-ablation-length",
    "expe-ablation-size",
    "expe-ablation-size-seeds",
    "expe-table2",
    "extension",
    "extension-methods",
    "medium",
    "medium-seeds",
    "medium-seeds-others",
    "mlm",
    "peers",
    "quick",
    "quick-precision",
    "quick-seeds",
    "rehearsal",
    "rehearsal-mask",
)
#: docs/results/ of the checkout this package was installed from (src/extrapos/compare/published.py)
RESULTS_DIR = Path(__file__).resolve().parents[3] / "docs" / "results"


def published_file(preset: str) -> Path:
    """Where ``preset``'s published table is in the checkout (it may be absent: a pip-installed package)."""
    return RESULTS_DIR / preset / "results.json"


def seeds_file(published: Path) -> Path | None:
    """The seeds run published beside a table (``X-seeds/results.json`` for ``X/results.json``), if any."""
    folder = published.parent
    if folder.name.endswith("-seeds"):
        return None  # a seeds table measures its own noise
    path = folder.with_name(f"{folder.name}-seeds") / "results.json"
    return path if path.is_file() else None


def read_results(path: Path, what: str) -> list[dict[str, Any]]:
    """A comparison's ``results.json`` (a list of rows, each with its ``results`` by length), else one
    sentence naming ``what`` was expected."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist; pass the results.json a comparison wrote.") from None
    except (OSError, ValueError):
        raise UserError(
            f"{what} {path} is not a readable JSON file; pass the results.json a comparison wrote."
        ) from None
    if not (
        isinstance(data, list)
        and data
        and all(isinstance(r, dict) and "name" in r and isinstance(r.get("results"), list) for r in data)
    ):
        raise UserError(
            f"{what} {path} is not the results.json of a comparison (a list of rows with their results); "
            "pass OUT/results.json of `extrapos compare` or docs/results/PRESET/results.json."
        )
    return data


def check_against(path: str) -> None:
    """``--against FILE`` read before any training, so that a wrong path costs seconds, not the sweep."""
    read_results(Path(path), "--against")


def closing_words(
    preset: str, out: Path, against: str | None = None, changed: str | None = None
) -> str | None:
    """What `extrapos compare` prints last about the published table: the comparison with it (``against``,
    else the preset's own when it publishes one), or one sentence saying why there is none; None for a
    sweep that has no published table. ``changed``: the options by which this run departs from the preset
    (``--set``, a budget...): the published table was made without them, so it is compared only when
    asked."""
    if against is None:
        if preset not in PUBLISHED:
            return None
        if changed:
            return (
                f"Not compared with the published {preset} table: it was made by the preset as it stands, "
                f"this run changed {changed} (pass --against {_shown(published_file(preset))} to compare "
                "anyway)."
            )
        path = published_file(preset)
        if not path.is_file():
            return (
                f"The published {preset} table (docs/results/{preset}/results.json) is in the repository, "
                "not in this installation; compare with it from a clone (make demo), or pass --against FILE."
            )
    else:
        path = Path(against)
    published = read_results(path, "the published table")
    mine_file = out / "results.json"
    if not mine_file.is_file():
        return "No loss table to compare with the published one: this comparison scored no loss columns."
    seeds = seeds_file(path)
    comparison = against_published(
        read_results(mine_file, "this comparison's table"),
        published,
        read_results(seeds, "the seeds table") if seeds else None,
    )
    return render(comparison, _shown(path), _shown(seeds) if seeds else None)


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the current directory where it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
