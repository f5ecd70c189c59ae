"""`extrapos check-encoding` (issue 45): every built-in encoding conforms, and three deliberately broken
ones fail, each naming its line (a causal leak, a cache that drifts, a fast path off the reference)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import extrapos.positions.registry as registry
from extrapos.cli import main
from extrapos.positions import PairwiseBias, PositionalEncoding
from extrapos.positions.registry import EncodingSpec, names
from extrapos.tools.conformance import check_encoding_conformance, format_conformance


@pytest.mark.parametrize("name", names())
def test_every_built_in_encoding_conforms(name):
    report = check_encoding_conformance(name)
    assert report.ok, format_conformance(report)
    assert [line.check for line in report.lines] == ["options", "causal", "cache", "fast path", "state"]


def _features(x: Tensor, positions: Tensor) -> Tensor:
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return positions.to(dtype)[:, None, :, None]


class Leaky(PositionalEncoding):
    """Adds the mean of the whole sequence's embeddings to every token: the future reaches the past."""

    @classmethod
    def acts_on_embeddings(cls, options) -> bool:
        return True

    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        return h + h.mean(dim=1, keepdim=True)


class Drifting(PositionalEncoding):
    """A bias by the distance to the LAST key: in a full forward that is the sequence's end for every
    query, in cached decoding the query itself, so decoding drifts from the full forward."""

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        p = _features(x, positions)

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            last = kf[:, :, -1:, 0]  # (B, 1, 1)
            # log1p: not linear in j, or the softmax would drop the row constant and nothing drift
            return (-0.5 * torch.log1p(last - kf[..., 0]))[:, :, None, :].expand(-1, -1, qf.shape[2], -1)

        return PairwiseBias(q_feat=p, k_feat=p, fn=fn)


class OffReference(PositionalEncoding):
    """An ALiBi-like bias whose slope is 0.1 in float64 but 0.1001 on the fp32 fast path."""

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        p = _features(x, positions)
        slope = 0.1 if x.dtype == torch.float64 else 0.1001

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            return -slope * (qf - kf.transpose(-1, -2)).abs()

        return PairwiseBias(q_feat=p, k_feat=p, fn=fn)


@dataclass
class Broken:
    name: str
    cls: type
    line: str


BROKEN = [
    Broken("broken-leak", Leaky, "causal"),
    Broken("broken-drift", Drifting, "cache"),
    Broken("broken-fast-path", OffReference, "fast path"),
]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda b: b.name)
def test_a_broken_encoding_fails_naming_its_line(monkeypatch, capsys, broken):
    registry._load()
    monkeypatch.setitem(registry._REGISTRY, broken.name, EncodingSpec(broken.name, broken.cls))
    report = check_encoding_conformance(broken.name)
    assert broken.line in report.failed() and not report.ok, format_conformance(report)
    assert main(["check-encoding", broken.name, "--no-export"]) == 1
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("does NOT conform:") and broken.line in verdict


def test_an_unbounded_numeric_option_fails_the_options_line(monkeypatch):
    from extrapos.bounds import CheckedOptions

    class Unbounded(PositionalEncoding):
        @dataclass(frozen=True)
        class Options(CheckedOptions):
            strength: float = 1.0  # numeric, and no Bound declared

    registry._load()
    monkeypatch.setitem(registry._REGISTRY, "broken-bounds", EncodingSpec("broken-bounds", Unbounded))
    report = check_encoding_conformance("broken-bounds")
    assert report.failed() == ["options"] and "strength" in report.lines[0].measured


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
@pytest.mark.parametrize("name", ["rope", "cable"])
def test_the_cli_checks_the_export_too(capsys, name):
    """`extrapos check-encoding` adds the export line (transformers loads the folder back) and exits 0."""
    assert main(["check-encoding", name]) == 0
    out = capsys.readouterr().out
    assert "| export |" in out and "conforms: every check holds" in out


def test_options_reach_the_check_and_bad_ones_are_one_sentence(capsys):
    assert (
        main(["check-encoding", "rope", "--option", "scaling=yarn", "--option", "factor=2", "--no-export"])
        == 0
    )
    assert "{'scaling': 'yarn', 'factor': 2}" in capsys.readouterr().out
    assert main(["check-encoding", "rope", "--option", "scaling=bogus", "--no-export"]) == 2
    assert "scaling (an option of encoding 'rope') must be one of 'linear'" in capsys.readouterr().err
    assert main(["check-encoding", "rope", "--option", "factor", "--no-export"]) == 2
    assert "--option wants KEY=VALUE" in capsys.readouterr().err
