"""Config: presets, dotted overrides, clear errors, and a resolved config that round-trips."""

import pytest

from extrapos.errors import UserError
from extrapos.run.config import find_config, from_dict, load_config, parse_override, preset_names, read_toml


def test_every_shipped_preset_loads():
    names = preset_names()
    assert {"cpu/tiny", "cpu/small", "expe-app-b", "expe-app-c-s", "cable-gpt2-tiny"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.seq_len > 0


def test_paper_presets_match_the_papers():
    b = load_config("expe-app-b")
    assert (b.model.d_model, b.model.n_layers, b.model.n_heads, b.model.dropout) == (384, 6, 12, 0.1)
    assert b.model.positions == {"name": "expe", "l": 24}
    assert (b.train.lr, b.train.end_lr, b.train.warmup, b.train.precision) == (1e-3, 3e-6, 0.1, "fp32")
    assert b.train.batch_tokens == 512 * 512 and b.seq_len == 512
    c = load_config("cable-gpt2-medium")
    assert (c.model.n_layers, c.model.d_model, c.seq_len, c.train.batch_tokens) == (24, 1024, 1024, 524_288)
    assert (c.train.lr, c.train.end_lr, c.train.warmup) == (6e-4, 6e-5, 750)


def test_paper_presets_pack_short_web_documents():
    # FineWeb-Edu documents average ~1,000 tokens: the web presets pack them (CABLE's nanoGPT stream,
    # no document mask, positions per window); ExPE App. B keeps documents of >= 4000 tokens unpacked
    for name in ("cable-gpt2-tiny", "cable-gpt2-small", "cable-gpt2-medium"):
        d = load_config(name).data
        assert (d.tokenizer, d.packed, d.document_mask, d.document_positions) == (
            "gpt2",
            True,
            False,
            "continue",
        )
    for name in ("expe-app-c-s", "expe-app-c-m"):
        d = load_config(name).data
        assert d.packed and not d.document_mask and d.tokenizer == "bpe:32768"
    b = load_config("expe-app-b").data
    assert not b.packed and b.min_doc_tokens == 4000


def test_overrides_and_round_trip():
    cfg = load_config(
        "cpu/tiny",
        ["train.lr=3e-4", "model.positions.name=expe", "model.positions.scale=0.5", "train.schedule=linear"],
    )
    assert cfg.train.lr == 3e-4 and cfg.train.schedule == "linear"
    assert cfg.model.positions == {"name": "expe", "scale": 0.5}
    import tomllib

    assert from_dict(tomllib.loads(cfg.to_toml())) == cfg


@pytest.mark.parametrize(
    "override, words",
    [
        (["train.lrr=1"], "unknown config key 'train.lrr'"),
        (["train.steps=ten"], "train.steps' must be int"),
        (["train.precision=fp16"], "train.precision"),
        (["model.positions.name=nosuch"], "unknown positional encoding"),
        (["model.positions.nosuch=1"], "has no option nosuch"),
        (["trainsteps"], "section.key=value"),
    ],
)
def test_bad_configs_are_one_clear_sentence(override, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        load_config("cpu/tiny", override)


def test_a_budget_override_replaces_the_presets_budget(tmp_path):
    cfg = load_config("cpu/tiny", ["train.tokens=1000"])
    assert (cfg.train.steps, cfg.train.tokens) == (None, 1000)
    both = tmp_path / "both.toml"
    both.write_text("[train]\nsteps = 10\ntokens = 1000\n")
    with pytest.raises(UserError, match="only one of"):
        load_config(str(both))


def test_unknown_preset_and_bad_toml(tmp_path):
    with pytest.raises(UserError, match="presets are"):
        find_config("no/such")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 1")
    with pytest.raises(UserError, match="not valid TOML"):
        read_toml(bad)


def test_bare_word_override_is_a_string():
    assert parse_override("model.positions.name=rope") == (["model", "positions", "name"], "rope")
    assert parse_override("train.lr=1e-3") == (["train", "lr"], 1e-3)


def test_web_corpus_sweeps_evaluate_on_the_stream():
    """The sweeps whose runs train on FineWeb-Edu score its test stream (no document holds 16 x L_t)."""
    from extrapos.compare import load_sweep

    for name in ("paper/cable-table1", "paper/expe-table1", "rehearsal"):
        sweep = load_sweep(name)
        assert (sweep.protocol, sweep.boundary) == ("stream", "cross"), name
    rehearsal = load_sweep("rehearsal")
    masked = [r for r in rehearsal.rows if "data.document_mask=true" in r.set]
    assert len(masked) == 2 and all('data.document_positions="restart"' in r.set for r in masked)
    assert load_config("cpu/rehearsal").data.tokenizer == "gpt2"


def test_the_expe_paper_presets_train_the_paper_s_models():
    """paper/expe-table1 has both sizes of ExPE's Table 1 (each M row is exactly expe-app-c-m with the row's
    encoding, each S row expe-app-c-s), and paper/expe-scaling scales the M model, as Table 3 does."""
    from dataclasses import replace

    from extrapos.compare import load_sweep
    from extrapos.compare.sweep import row_config

    table1 = load_sweep("paper/expe-table1")
    for row in table1.rows:
        size = row.name.split()[-1]
        preset = load_config({"S": "expe-app-c-s", "M": "expe-app-c-m"}[size])
        want = replace(preset, model=replace(preset.model, positions=dict(row.positions)))
        assert row_config(table1, row, []) == want, row.name
    assert sorted(r.name.split()[-1] for r in table1.rows) == ["M"] * 3 + ["S"] * 3
    scaling = load_sweep("paper/expe-scaling")
    m = load_config("expe-app-c-m").model  # the 342M llama-m: 24 x 1024, tied embeddings
    assert scaling.train == "expe-app-c-m" and (m.n_layers, m.d_model, m.tie_embeddings) == (24, 1024, True)
    assert {r.eval.get("scale") for r in scaling.rows if r.reuse} == {0.5}
    assert (scaling.protocol, scaling.boundary) == ("stream", "cross")


def test_unpacking_a_packed_preset_names_what_is_still_set():
    """cpu/medium packs with a document mask and restarted positions: unpacking it names each setting that is
    still on, and the message's fix is the one that works (both off)."""
    with pytest.raises(UserError, match=r'^data\.document_positions = "restart" apply to packed rows only'):
        load_config("cpu/medium", ["data.packed=false", "data.document_mask=false"])
    with pytest.raises(
        UserError, match=r"^data\.document_mask = true and data\.document_positions = \"restart\""
    ):
        load_config("cpu/medium", ["data.packed=false"])
    fixed = load_config(
        "cpu/medium", ["data.packed=false", "data.document_mask=false", 'data.document_positions="continue"']
    )
    assert not fixed.data.packed
