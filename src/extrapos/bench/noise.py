"""Whether a bench figure stands out of the machine's noise, and how busy the machine was meanwhile.

The bench interleaves its repeats (every round visits every encoding), so the per-round ratios of an
encoding to NoPE are paired: a load spike slows both sides of one round. A target is judged only
when every round's ratio falls on the same side of it; when the rounds' range holds the target the
verdict is withheld (``~``), as ``benchmarks/bench_peers.py`` marks a ratio whose rounds straddle 1.
A median alone hides this: a run at load ~5 once printed "met" from repeats spread 574-1355 %.

On a shared machine a step with as many threads as cores waits for the other processes' threads, so
the load average (the run queue, ``os.getloadavg``) is recorded beside every run and a warning is
printed when the other processes take the room the bench's threads need.
"""

from __future__ import annotations

import os
from typing import Any

#: what a withheld verdict prints
WITHHELD = "~"


def round_ratios(times: list[float], base: list[float]) -> list[float]:
    """The per-round ratios of one encoding's times to NoPE's, measured in the same interleaved rounds."""
    if len(times) != len(base) or not times:
        raise ValueError("per-round ratios need the same, non-zero number of rounds on both sides")
    return [t / b for t, b in zip(times, base)]


def verdict(rounds: dict[str, list[float]], target: float, higher: bool) -> str:
    """ "yes" when every round of every encoding meets the target, "no" when every round of some encoding
    misses it, else WITHHELD: the rounds' spread holds the target, so the medians' verdict is noise."""
    if not rounds or not all(rounds.values()):
        raise ValueError("a verdict needs at least one round of at least one figure")

    def meets(v: float) -> bool:
        return v >= target if higher else v <= target

    if all(meets(v) for values in rounds.values() for v in values):
        return "yes"
    if any(all(not meets(v) for v in values) for values in rounds.values()):
        return "no"
    return WITHHELD


# ---- the machine's load ---------------------------------------------------------------------------


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: a container's or taskset's limit included)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable and waiting threads), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def others_load(samples: list[float | None], threads: int) -> float | None:
    """The load of the other processes: the first sample is taken before the bench runs, later ones
    count the bench's own ``threads`` too (the 1-minute average approaches them), so they are removed."""
    known = [s for s in samples if s is not None]
    if not known:
        return None
    later = [s - threads for s in samples[1:] if s is not None]
    return max([samples[0] if samples[0] is not None else 0.0] + later)


def load_warning(samples: list[float | None], threads: int, cores: int) -> str | None:
    """A sentence when the other processes left fewer idle cores than the bench's threads (half a core
    of slack), else None."""
    others = others_load(samples, threads)
    if others is None or others <= max(cores - threads, 0) + 0.5:
        return None
    advice = "an idle machine" if threads == 1 else "an idle machine, or with --threads 1"
    return (
        f"the machine was busy: load average up to {max(s for s in samples if s is not None):.1f} on {cores} "
        f"cores (other processes ~{others:.1f}) with {threads} bench thread(s), so the timings are "
        f"noise-bound; verdicts the rounds' spread cannot settle are withheld (~). Rerun on {advice}."
    )


def load_facts(samples: list[float | None], threads: int) -> dict[str, Any]:
    """The load samples, cores, threads and warning, as the bench's JSON keeps them."""
    cores = usable_cores()
    return {
        "load_samples": samples,
        "cores": cores,
        "threads": threads,
        "warning": load_warning(samples, threads, cores),
    }
