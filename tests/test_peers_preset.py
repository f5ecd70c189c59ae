"""The ``peers`` comparison preset trains every registered encoding once (issue 17)."""

from extrapos import compare
from extrapos.positions import registry


def test_peers_has_one_trained_row_per_registered_encoding():
    sweep = compare.load_sweep("peers")
    trained = [r for r in sweep.rows if not r.reuse and r.extend is None]
    names = [r.positions["name"] for r in trained]
    assert sorted(names) == sorted(registry.names()) and len(names) == len(set(names))
    quick = compare.load_sweep("quick")
    assert (sweep.train, sweep.set, sweep.lengths) == (quick.train, quick.set, quick.lengths)
    for row in trained:  # every row's config builds (options valid for its encoding)
        assert compare.row_config(sweep, row, []).model.positions["name"] == row.positions["name"]
    bca = next(r for r in sweep.rows if r.reuse)
    assert bca.reuse == "xPos" and bca.eval == {"blockwise": True}
