"""Sentence embeddings of an encoder run, and its sentence-transformers export."""

import json

import numpy as np
import pytest
import torch

from extrapos.errors import UserError
from extrapos.inference.embeddings import embed_texts, text_ids
from tests.conftest import encoder_overrides, tiny_overrides

TEXTS = [
    "The state of the union is strong.",
    "Congress shall make no law.",
    "We hold these truths to be self-evident, that all men are created equal, that they are endowed "
    "by their Creator with certain unalienable rights.",
    "Peace",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """One tiny encoder run per encoding (learned, CABLE, and FIRE, whose bias reads the sequence length)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    root = tmp_path_factory.mktemp("encoders")
    out = {}
    for name in ("learned", "cable", "fire"):
        cfg = load_config("cpu/tiny", encoder_overrides(tiny_data, **{"model.positions": f'"{name}"'}))
        train(cfg, root / name, progress=False)
        out[name] = root / name
    return out


def _reference(run_dir, text, max_length=16, pooling="mean", options=None):
    """One text alone, straight through the model: [CLS] ids [SEP] at positions 0..n-1, no batching."""
    from extrapos.data.mlm import encoder_special_tokens
    from extrapos.run.directory import load_run

    run = load_run(run_dir)
    if options:
        run.model.pos.set_options(**options)
    sp = encoder_special_tokens(run.tokenizer)
    ids = [sp.cls, *run.tokenizer.encode(text)[: max_length - 2], sp.sep]
    with torch.no_grad():
        h = run.model.hidden_states(torch.tensor([ids]), torch.arange(len(ids))[None])[0]
    return (h.mean(0) if pooling == "mean" else h[0]).numpy()


@pytest.mark.parametrize("name", ["learned", "cable", "fire"])
def test_padding_never_changes_a_texts_embedding(runs, name):
    alone = embed_texts(runs[name], TEXTS[:1])
    batched = embed_texts(runs[name], TEXTS, batch_size=3)
    assert batched.shape == (4, 32) and batched.dtype == np.float32
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-6)
    for text, row in zip(TEXTS, batched):
        np.testing.assert_allclose(row, _reference(runs[name], text), atol=1e-5)
    cls = embed_texts(runs[name], TEXTS, pooling="cls", normalize=True)
    ref = _reference(runs[name], TEXTS[2], pooling="cls")
    np.testing.assert_allclose(cls[2], ref / np.linalg.norm(ref), atol=1e-5)


def test_texts_are_wrapped_and_truncated_to_the_maximum_length(runs):
    from extrapos.run.directory import load_run

    tok = load_run(runs["cable"]).tokenizer
    ids = text_ids(tok, TEXTS, 8)
    assert [len(x) for x in ids] == [min(len(tok.encode(t)) + 2, 8) for t in TEXTS]
    assert len({x[0] for x in ids}) == 1 and len({x[-1] for x in ids}) == 1  # [CLS] first, [SEP] last
    long = embed_texts(runs["cable"], TEXTS[2:3], max_length=8)
    np.testing.assert_allclose(long[0], _reference(runs["cable"], TEXTS[2], max_length=8), atol=1e-5)
    # default: the run's L_t (16) tokens, so the long text is cut there
    np.testing.assert_allclose(embed_texts(runs["cable"], TEXTS[2:3])[0], _reference(runs["cable"], TEXTS[2]))


def test_embedding_mistakes_are_user_errors(runs, tiny_data, tmp_path):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    with pytest.raises(UserError, match="pooling"):
        embed_texts(runs["cable"], TEXTS, pooling="max")
    with pytest.raises(UserError, match="at least 3 tokens"):
        embed_texts(runs["cable"], TEXTS, max_length=2)
    with pytest.raises(UserError, match="list of strings"):
        embed_texts(runs["cable"], "one text")
    decoder = tmp_path / "decoder"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 1})), decoder, progress=False)
    with pytest.raises(UserError, match="decoder run"):
        embed_texts(decoder, TEXTS)


# ---- sentence-transformers ----------------------------------------------------------------------------

st = pytest.importorskip("sentence_transformers")


def _export(run_dir, out, *extra):
    from extrapos.cli import main

    assert main(["export", str(run_dir), "--format", "sentence-transformers", "--out", str(out), *extra]) == 0
    return out


@pytest.mark.parametrize("name", ["learned", "cable"])
def test_sentence_transformers_loads_the_export_and_embeds_as_extrapos(runs, name, tmp_path):
    out = _export(runs[name], tmp_path / "st")
    model = st.SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    got = model.encode(TEXTS, batch_size=3, convert_to_numpy=True)
    np.testing.assert_allclose(got, embed_texts(runs[name], TEXTS), atol=1e-5)
    assert model.get_embedding_dimension() == 32 and model.max_seq_length == 16
    modules = json.loads((out / "modules.json").read_text())
    assert modules[0]["type"] == "extrapos.integrations.sentence_transformers.ExtraposEncoder"
    assert modules[1]["type"].endswith("Pooling")
    assert json.loads((out / "extrapos.json").read_text())["positions"]["name"] == name
    # a longer limit set on the loaded model is honoured, as extrapos' max_length; a learned table
    # stops at its length (16) unless the encoding is told to interpolate
    model.max_seq_length = 24
    if name == "learned":
        with pytest.raises(UserError, match="interpolate_to"):
            model.encode(TEXTS[2:3])
        model[0].model.pos.set_options(interpolate_to=24)
    np.testing.assert_allclose(
        model.encode(TEXTS[2:3], convert_to_numpy=True)[0],
        _reference(
            runs[name], TEXTS[2], max_length=24, options={"interpolate_to": 24} if name == "learned" else {}
        ),
        atol=1e-5,
    )


def test_cls_pooling_and_normalisation_export(runs, tmp_path):
    out = _export(runs["cable"], tmp_path / "st", "--pooling", "cls", "--normalize", "--max-length", "12")
    model = st.SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    got = model.encode(TEXTS, convert_to_numpy=True)
    want = embed_texts(runs["cable"], TEXTS, pooling="cls", normalize=True, max_length=12)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [type(m).__name__ for m in model] == ["ExtraposEncoder", "Pooling", "Normalize"]


def test_sentence_transformers_asks_to_trust_the_extrapos_module(runs, tmp_path):
    out = _export(runs["cable"], tmp_path / "st")
    with pytest.raises(ValueError, match="trust_remote_code"):
        st.SentenceTransformer(str(out), device="cpu")


def test_a_fine_tuning_step_with_multiple_negatives_ranking_loss(runs, tmp_path):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    out = _export(runs["cable"], tmp_path / "st")
    model = st.SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    pairs = [  # (query, positive passage): local stand-ins for MS-MARCO's
        ("who wrote the constitution", "The Constitution was written by the delegates in Philadelphia."),
        ("state of the union", "The President reports on the state of the union to Congress."),
        ("what is peace", "Peace is the absence of war between nations."),
        ("taxes and revenue", "Congress raises revenue through taxes and duties."),
    ]
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loss_fn = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    features = [model.preprocess([q for q, _ in pairs]), model.preprocess([p for _, p in pairs])]
    loss = loss_fn(features, labels=None)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("0.model.blocks.") for k in changed), changed
    # the fine-tuned model saves and loads back with its new weights
    model.eval()
    tuned = model.encode([q for q, _ in pairs], convert_to_numpy=True)
    model.save(str(tmp_path / "tuned"))
    again = st.SentenceTransformer(str(tmp_path / "tuned"), trust_remote_code=True, device="cpu")
    np.testing.assert_allclose(again.encode([q for q, _ in pairs], convert_to_numpy=True), tuned, atol=1e-6)
    assert not np.allclose(tuned, embed_texts(runs["cable"], [q for q, _ in pairs]), atol=1e-4)
