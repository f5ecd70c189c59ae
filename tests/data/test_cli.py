"""`extrapos data prepare | info` through extrapos.cli.main: success output and one-line errors (exit 2)."""

from __future__ import annotations

import pytest

from extrapos.cli import main


def prepare_args(corpus, out, *extra):
    return [
        "data",
        "prepare",
        "--corpus",
        str(corpus),
        "--tokenizer",
        "bpe:300",
        "--out",
        str(out),
        "--quiet",
        "--split-fractions",
        "0.5,0.25,0.25",
        *extra,
    ]


def assert_one_line_error(capsys, code, *fragments):
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("extrapos: error: "), captured.err
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0]


def test_prepare_then_reuse_then_info(text_dir, tmp_path, capsys):
    out = tmp_path / "prepared"
    assert main(prepare_args(text_dir, out)) == 0
    first = capsys.readouterr().out
    assert first.startswith(f"Prepared {out}") and "train" in first and "uint16" in first
    assert main(prepare_args(text_dir, out)) == 0
    assert capsys.readouterr().out.startswith(f"Reused {out}")
    assert main(["data", "info", str(out)]) == 0
    info = capsys.readouterr().out
    assert '"tokenizer"' in info and "document length (tokens)" in info and "p50" in info


def test_prepare_with_max_docs_on_the_default_corpus(tmp_path, capsys):
    out = tmp_path / "sotu"
    assert (
        main(
            [
                "data",
                "prepare",
                "--max-docs",
                "3",
                "--tokenizer",
                "bpe:300",
                "--out",
                str(out),
                "--quiet",
                "--split-fractions",
                "1,0,0",
                "--min-doc-tokens",
                "100",
            ]
        )
        == 0
    )
    assert "train 3 docs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "corpus, extra, fragments",
    [
        ("{tmp}/missing", [], ["does not exist"]),
        ("{tmp}/empty", [], ["corpus is empty"]),
        ("wikipedia", [], ["Unknown corpus 'wikipedia'"]),
        ("{texts}", ["--tokenizer", "gpt9"], ["Unknown tokenizer 'gpt9'"]),
        ("{texts}", ["--min-doc-tokens", "1000000"], ["left after filtering", "--min-doc-tokens"]),
        ("{texts}", ["--split-fractions", "0.9,0.2,0.1"], ["Split fractions"]),
        ("{texts}", ["--max-docs", "0"], ["--max-docs"]),
    ],
)
def test_bad_prepare_inputs_exit_2_with_one_line(text_dir, tmp_path, capsys, corpus, extra, fragments):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    spec = corpus.format(tmp=tmp_path, texts=text_dir)
    assert_one_line_error(capsys, main(prepare_args(spec, out, *extra)), *fragments)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_hub_corpus_without_datasets_exits_2(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    code = main(prepare_args("hf:HuggingFaceFW/fineweb-edu:sample-10BT", tmp_path / "out"))
    assert_one_line_error(capsys, code, "pip install 'extrapos[hub]'")


def test_info_on_missing_or_foreign_directory(tmp_path, capsys):
    assert_one_line_error(capsys, main(["data", "info", str(tmp_path / "nope")]), "No prepared data")
    assert_one_line_error(capsys, main(["data", "info", str(tmp_path)]), "not a prepared data directory")
