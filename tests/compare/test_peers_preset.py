"""The ``peers`` comparison preset trains every registered encoding once (issue 17)."""

import torch

from extrapos import compare
from extrapos.model import Decoder
from extrapos.positions import registry


def test_peers_has_one_trained_row_per_registered_encoding():
    sweep = compare.load_sweep("peers")
    trained = [r for r in sweep.rows if not r.reuse and r.extend is None]
    plain = [r.positions["name"] for r in trained if "layers" not in r.positions]
    assert sorted(plain) == sorted(registry.names()) and len(plain) == len(set(plain))
    hybrids = [r for r in trained if "layers" in r.positions]
    assert [r.positions["layers"] for r in hybrids] == ["all but every 4th", "all but every 2nd"]
    quick = compare.load_sweep("quick")
    assert (sweep.train, sweep.set, sweep.lengths) == (quick.train, quick.set, quick.lengths)
    for row in trained:  # every row's config builds (options valid for its encoding, layers for the model)
        assert compare.row_config(sweep, row, []).model.positions == row.positions
    cfg = compare.row_config(sweep, hybrids[0], [])
    with torch.device("meta"):
        assert Decoder(cfg.model).pos.layers == (0, 1, 2)  # cpu-small has 4 layers: NoPE on the last
    bca = next(r for r in sweep.rows if r.reuse)
    assert bca.reuse == "xPos" and bca.eval == {"blockwise": True}
