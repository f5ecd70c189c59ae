"""extrapos' RULER metric equals RULER's (Hsieh et al. 2024, §3 and Appendix B: recall-based string match,
"all" for NIAH / VT / CWE / FWE, "part" for QA) on a fixed, shared set of predictions, written here from the
published definition: a reference counts when it occurs in the prediction, ignoring case; "all" averages
the fraction of an example's references found, "part" whether any is found; a task's score is the mean over
its examples in percent, rounded to two decimals."""

import pytest

from extrapos.tasks.ruler_metric import postprocess, recall, task_score


def ruler_all(predictions, references):
    total = 0.0
    for pred, refs in zip(predictions, references):
        found = 0
        for r in refs:
            if r.lower() in pred.lower():
                found += 1
        total += found / len(refs)
    return round(total / len(predictions) * 100, 2)


def ruler_part(predictions, references):
    total = 0.0
    for pred, refs in zip(predictions, references):
        total += 1.0 if any(r.lower() in pred.lower() for r in refs) else 0.0
    return round(total / len(predictions) * 100, 2)


# (prediction, references): exact, reordered, partial, case, a longer number holding the reference (a
# substring counts, as in RULER), nothing, several answers, a UUID, an empty prediction
SHARED = [
    ("The special magic number is 4453097.", ["4453097"]),
    ("5228414, 7728275 and 2945271", ["7728275", "8950927", "5228414", "2945271"]),
    ("DVXQN FODLD", ["DVXQN", "FODLD", "DXLKL", "VMXHF", "FAAEI"]),
    ("Answer: dvxqn fodld dxlkl", ["DVXQN", "FODLD", "DXLKL"]),
    ("44530971", ["4453097"]),
    ("I do not know.", ["chair", "garden", "steep"]),
    ("1. chair 2. garden 3. rare", ["chair", "garden", "steep"]),
    ("d1fdf528-f5e6-4375-aec2-ef468a72eb0d", ["d1fdf528-f5e6-4375-aec2-ef468a72eb0d"]),
    ("", ["Denver Broncos", "Broncos"]),
    ("the Broncos won", ["Denver Broncos", "Broncos"]),
    ("Paris, France", ["paris"]),
]


def test_all_equals_rulers_on_the_shared_predictions():
    preds = [p for p, _ in SHARED]
    refs = [r for _, r in SHARED]
    assert task_score(preds, refs, "all") == ruler_all(preds, refs) == 66.52
    assert [round(recall(p, r, "all"), 4) for p, r in SHARED] == [1, 0.75, 0.4, 1, 1, 0, 0.6667, 1, 0, 0.5, 1]
    for p, r in SHARED:  # one example at a time too
        assert task_score([p], [r], "all") == ruler_all([p], [r])


def test_part_equals_rulers_on_the_shared_predictions():
    preds = [p for p, _ in SHARED]
    refs = [r for _, r in SHARED]
    assert task_score(preds, refs, "part") == ruler_part(preds, refs) == 81.82
    assert [recall(p, r, "part") for p, r in SHARED] == [1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1]


def test_predictions_are_cleaned_as_ruler_cleans_them():
    assert postprocess("  4453097\n\tand 12\x00 ") == "4453097\n\nand 12"
    with pytest.raises(ValueError):
        recall("x", ["x"], "some")
