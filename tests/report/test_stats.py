"""Bootstrap intervals: nominal coverage, paired differences that shrink with shared noise, seeds."""

import numpy as np
import pytest

from extrapos.report.stats import cell_samples, loss_interval, paired_difference


def _documents(rng, n, mean=5.0, tokens=64):
    """Per-document loss sums of ``n`` documents whose mean token loss is gamma-distributed around
    ``mean``."""
    counts = rng.integers(tokens // 2, 2 * tokens, size=n).astype(float)
    per_token = rng.gamma(4.0, mean / 4.0, size=n)  # skewed, like real document losses
    return per_token * counts, counts


@pytest.mark.parametrize("level", [0.95, 0.5])
def test_document_bootstrap_covers_the_mean_at_the_nominal_rate(level):
    # the ratio estimator's target is E[sum] / E[count] = the gamma mean (losses independent of lengths)
    rng = np.random.default_rng(0)
    trials, hits = 300, 0
    for _ in range(trials):
        sums, counts = _documents(rng, 60)
        hits += loss_interval(sums, counts, level=level, resamples=400).contains(5.0)
    coverage = hits / trials
    # binomial noise of 300 trials is about 0.013 at 0.95 and 0.03 at 0.5; the percentile bootstrap of
    # 60 skewed documents undercovers a little, so the band is one-sided generous below
    assert level - 0.06 <= coverage <= level + 0.04, coverage


def test_intervals_are_reproducible_and_narrow_with_more_documents():
    rng = np.random.default_rng(1)
    sums, counts = _documents(rng, 400)
    a, b = loss_interval(sums, counts), loss_interval(sums, counts)
    assert a == b  # fixed bootstrap seed: a re-rendered report is byte-identical
    few = loss_interval(sums[:25], counts[:25])
    assert (a.high - a.low) < 0.5 * (few.high - few.low)
    assert a.low < a.estimate < a.high
    assert a.estimate == pytest.approx(sums.sum() / counts.sum())


def test_paired_interval_shrinks_when_rows_share_document_noise():
    rng = np.random.default_rng(2)
    sums, counts = _documents(rng, 80)
    # two "models" on the same documents: the document difficulty is shared, B is 0.02 nats worse
    a = sums + rng.normal(0, 0.01, 80) * counts
    b = sums + (0.02 + rng.normal(0, 0.01, 80)) * counts
    paired = paired_difference(b, counts, a, counts)
    ia, ib = loss_interval(a, counts), loss_interval(b, counts)
    unpaired_width = np.hypot(ia.high - ia.low, ib.high - ib.low)
    assert (paired.high - paired.low) < 0.1 * unpaired_width
    assert paired.contains(0.02) and not paired.contains(0.0)
    assert ia.contains(ib.estimate)  # unpaired, the two rows look the same
    same = paired_difference(a, counts, a, counts)
    assert same.estimate == 0.0 and same.low == 0.0 and same.high == 0.0


def test_paired_rows_must_have_the_same_shape():
    with pytest.raises(ValueError, match="same seeds and documents"):
        paired_difference(np.ones(3), np.ones(3), np.ones(4), np.ones(4))


def test_seeds_widen_the_interval_by_their_spread_and_identical_seeds_change_nothing():
    rng = np.random.default_rng(3)
    sums, counts = _documents(rng, 100)
    one = loss_interval(sums, counts)
    same = loss_interval(np.stack([sums] * 3), np.stack([counts] * 3))
    assert (same.low, same.high, same.estimate) == pytest.approx((one.low, one.high, one.estimate))
    assert same.seeds == 3 and same.seed_sd == pytest.approx(0.0)
    # documents that agree closely (width ~0.01) and seeds that do not (sd 0.1): the seeds dominate
    flat = counts * rng.normal(5.0, 0.05, size=100)
    shifted = np.stack([flat + d * counts for d in (-0.1, 0.0, 0.1)])
    spread = loss_interval(shifted, np.stack([counts] * 3))
    narrow = loss_interval(flat, counts)
    assert spread.seed_sd == pytest.approx(0.1)
    assert (narrow.high - narrow.low) < 0.03 < 0.1 < (spread.high - spread.low)
    assert spread.estimate == pytest.approx(narrow.estimate)


def test_cell_samples_reads_results_and_refuses_old_or_misaligned_ones():
    row = {"ev": 1, "doc_index": [3, 7], "doc_loss_sums": [10.0, 20.0], "doc_tokens": [2, 4]}
    result = {"results": [row]}
    s = cell_samples(result, 1)
    assert s.doc_index == (3, 7) and s.sums.shape == (1, 2) and s.counts.tolist() == [[2.0, 4.0]]
    assert cell_samples(result, 2) is None
    assert cell_samples({"results": [{"ev": 1, "loss": 5.0}]}, 1) is None  # saved before per-document data
    seeded = {"results": [], "seeds": [result, {"results": [dict(row, doc_loss_sums=[11.0, 19.0])]}]}
    assert cell_samples(seeded, 1).sums.tolist() == [[10.0, 20.0], [11.0, 19.0]]
    misaligned = {"results": [], "seeds": [result, {"results": [dict(row, doc_index=[3, 8])]}]}
    assert cell_samples(misaligned, 1) is None


def test_length_change_is_paired_over_the_same_targets_and_says_when_it_is_noise():
    from extrapos.report.render import Row, length_change_table

    rng = np.random.default_rng(5)
    sums, counts = _documents(rng, 30)
    idx = list(range(30))

    def cell(ev, s, c=counts, index=idx):
        return {
            "ev": ev,
            "loss": float(s.sum() / c.sum()),
            "doc_index": index,
            "doc_loss_sums": s.tolist(),
            "doc_tokens": c.tolist(),
        }

    # at ev=2: +-0.03 nats on alternate documents, zero in total (noise around no change); at ev=4: worse
    # by 0.05 nats per token on every document
    jitter = np.where(np.arange(30) % 2 == 0, 0.03, -0.03) * counts
    jitter -= counts * jitter.sum() / counts.sum()
    worse = Row("worse", {"results": [cell(1, sums), cell(2, sums + jitter), cell(4, sums + 0.05 * counts)]})
    # another row whose ev=4 column scored other documents: no paired change can be computed
    other = Row("other", {"results": [cell(1, sums), cell(2, sums), cell(4, sums, index=idx[::-1])]})
    table = length_change_table([worse, other])
    lines = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:]}
    ev2, ev4 = lines["worse"].split(" | ")[1:3]
    assert "within noise" in ev2
    assert ev4.startswith("+0.050 [+0.050, +0.050]") and "within noise" not in ev4
    assert lines["other"].split(" | ")[2].startswith("–")
    assert length_change_table([Row("one", {"results": [cell(1, sums)]})]) is None


def test_length_interval_is_the_document_bootstrap_or_says_why_not():
    from extrapos.report.stats import MIN_DOCUMENTS, length_interval

    rng = np.random.default_rng(3)
    sums, counts = _documents(rng, MIN_DOCUMENTS)

    def result(n):
        row = {"ev": 0.5, "doc_index": list(range(n)), "doc_loss_sums": list(sums[:n])}
        return {"results": [{**row, "doc_tokens": list(counts[:n])}]}

    interval, text = length_interval(result(MIN_DOCUMENTS), 0.5)
    expected = loss_interval(sums, counts)
    assert (interval.low, interval.high) == (expected.low, expected.high)
    assert text == f"[{expected.low:.4f}, {expected.high:.4f}]"
    few = MIN_DOCUMENTS - 1
    assert length_interval(result(few), 0.5) == (
        None,
        f"too few documents for an interval ({few}; it needs {MIN_DOCUMENTS})",
    )
    interval, text = length_interval({"results": [{"ev": 0.5, "loss": 5.0}]}, 0.5)
    assert interval is None and "no per-document losses" in text


def test_eval_prints_the_paired_change_to_1x_which_is_narrower_than_either_length_interval():
    """`extrapos eval`'s console table: each length minus 1x over the same targets (paired); the reader's
    question. A shift of 0.02 nats on every document is invisible between the per-length intervals
    (documents vary by far more) but exact in the paired column; other targets at 2x are not paired."""
    from extrapos.evaluate import format_result
    from extrapos.report.stats import MIN_DOCUMENTS, length_difference, length_interval

    rng = np.random.default_rng(8)
    sums, counts = _documents(rng, 40)

    def cell(ev, s, index=None, targets="t"):
        return {
            "ev": ev,
            "window": 64 * ev,
            "loss": float(s.sum() / counts.sum()),
            "ppl": 1.0,
            "bpb": 1.0,
            "tail_loss": 1.0,
            "doc_index": index or list(range(40)),
            "doc_loss_sums": s.tolist(),
            "doc_tokens": counts.tolist(),
            "targets": targets,
        }

    result = {"results": [cell(1, sums), cell(4, sums + 0.02 * counts)]}
    d, text = length_difference(result, 4, 1)
    assert d.estimate == pytest.approx(0.02) and d.high - d.low < 1e-9 and "within noise" not in text
    one, four = length_interval(result, 1)[0], length_interval(result, 4)[0]
    assert one.high > four.low  # the per-length intervals overlap: read alone they would say "no change"
    assert length_difference(result, 1, 1) == (None, "reference")
    moved = {"results": [cell(1, sums), cell(2, sums, targets="other")]}
    assert length_difference(moved, 2, 1)[0] is None and "not paired" in length_difference(moved, 2, 1)[1]
    few = {"results": [cell(1, sums[:3], index=[0, 1, 2]), cell(2, sums[:3], index=[0, 1, 2])]}
    for r in few["results"]:
        r["doc_tokens"] = counts[:3].tolist()
    assert length_difference(few, 2, 1)[0] is None and 3 < MIN_DOCUMENTS

    printed = format_result(
        {
            **result,
            "run": "r",
            "encoding": "rope",
            "train_length": 64,
            "applied": None,
            "target_tokens": int(counts.sum()),
            "documents_used": 40,
            "documents_skipped": 0,
        }
    )
    header = next(line for line in printed.splitlines() if line.startswith("| ev |"))
    assert header.endswith("| loss - ev=1 (paired 95%) |")
    row4 = next(line for line in printed.splitlines() if line.startswith("| 4 |"))
    assert row4.split(" | ")[-1].startswith(f"{d.estimate:+.4f} [{d.low:+.4f}, {d.high:+.4f}]")
    assert "| 1 |" in printed and "reference" in printed
