"""`extrapos doctor` on CPU (issue 27): every registered encoding's training step and cached decode agree
with the float64 reference on the fastest path here, and the check fails when a path does not."""

from __future__ import annotations

import json

import pytest

from extrapos.cli import main
from extrapos.positions.registry import names
from extrapos.tools.doctor import TOLERANCE, check_encoding, doctor, format_report


@pytest.fixture(scope="module")
def report():
    return doctor("cpu", speed=False, progress=False)


def test_every_encoding_agrees_with_the_reference(report):
    assert [c.name for c in report.checks] == names()
    assert report.precision == "fp32" and report.machine["cpu_capability"]
    for c in report.checks:
        assert c.error is None, (c.name, c.error)
        assert max(c.loss, c.logits, c.grads, c.decode) <= TOLERANCE["fp32"], c
    assert report.ok
    table = format_report(report)
    assert "every encoding agrees with the reference" in table and table.count("| yes |") == len(names())


def test_a_path_that_disagrees_is_reported(monkeypatch):
    import torch

    import extrapos.tools.doctor as doc

    real = doc._decode
    monkeypatch.setattr(doc, "_decode", lambda *a: real(*a) + 1e-3 * torch.randn(1))
    check = check_encoding("rope", torch.device("cpu"), "fp32")
    assert check.decode > TOLERANCE["fp32"] and not check.ok


def test_cli_writes_the_table_and_json(tmp_path, capsys):
    path = tmp_path / "doctor.json"
    code = main(["doctor", "--encodings", "alibi,rope", "--no-speed", "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and "| alibi |" in out and "| rope |" in out
    saved = json.loads(path.read_text())
    assert saved["ok"] and [c["name"] for c in saved["checks"]] == ["alibi", "rope"]
    assert main(["doctor", "--encodings", "nosuch", "--no-speed"]) == 2
    assert "unknown positional encoding" in capsys.readouterr().err


def test_each_check_is_heard_as_it_finishes():
    """``on_check`` hears of every encoding as its check ends, in order, with its seconds (gpu-check logs
    them: on an H200 the doctor of three pairwise biases ran 195 s without a line)."""
    heard = []
    report = doctor(
        "cpu", ["rope", "alibi"], speed=False, progress=False, on_check=lambda c, s: heard.append((c, s))
    )
    assert [c.name for c, _ in heard] == ["rope", "alibi"] and all(s > 0 for _, s in heard)
    assert [c for c, _ in heard] == report.checks


def test_a_fast_path_that_falls_back_is_reported(monkeypatch):
    """On a GPU a refused FlexAttention compile falls back to the chunked path with a warning; the doctor's
    row stays a pass (the fallback is correct) and names the fallback, so a GPU session sees which
    encodings did not take the fast path (on the first H200, FIRE's compiled backward was refused)."""
    import torch

    import extrapos.attention.dispatch as dispatch_mod
    import extrapos.attention.flex as flex_mod

    def refused(*args, **kwargs):
        raise RuntimeError("LoweringException: a score_mod inductor refuses")

    monkeypatch.setattr(dispatch_mod, "flex_wanted", lambda *a, **k: True)
    monkeypatch.setattr(flex_mod, "_flex_state", {"fn": refused, "mask": lambda *a, **k: None})
    check = check_encoding("kerple-log", torch.device("cpu"), "fp32")
    assert check.ok and check.fallbacks and "inductor refuses" in check.fallbacks[0]
    report = doctor("cpu", ["rope"], speed=False, progress=False)
    report.checks.append(check)
    assert "- kerple-log: FlexAttention failed for" in format_report(report)
