"""`extrapos export --format sentence-transformers` onto a file-size limit (issue 24's traceback list):
exit status 2, one sentence naming --out (never the temporary directory just removed), nothing left
behind, the run unchanged, and the same export works once the limit is gone."""

from __future__ import annotations

import pytest
from harness import assert_user_error, run

from tests.conftest import encoder_overrides

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, tiny_data):
    """A finished 3-step masked-LM run of a one-layer encoder."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    path = tmp_path_factory.mktemp("runs") / "encoder"
    train(load_config("cpu/tiny", encoder_overrides(tiny_data)), path, progress=False)
    return path


@pytest.mark.slow  # ~30 s; the same limit is tested by default on HF import and export, data and checkpoints
def test_sentence_transformers_export_under_a_file_size_limit(encoder, scratch, cache):
    args = ["export", encoder, "--out", scratch / "st", "--format", "sentence-transformers"]
    sentence = assert_user_error(
        args,
        cache=cache,
        watch=[encoder],
        fragments=[str(scratch / "st"), "File too large", "export again"],
        fsize_limit=4096,
    )
    assert ".tmp-" not in sentence
    assert not (scratch / "st").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".tmp")] == []
    done = run(args, cache=cache)
    assert done.returncode == 0, done.stderr
    assert (scratch / "st" / "modules.json").is_file()
