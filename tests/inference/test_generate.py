"""Generation: the KV cache gives the same tokens as recomputation for every encoding, prompts may
exceed the training length, sampling filters behave, and the CLI streams text."""

import pytest
import torch

from extrapos.inference.generate import filter_logits, generate_tokens
from extrapos.model import Decoder, model_config
from extrapos.positions import registry


@pytest.mark.parametrize("name", registry.names())
def test_cached_generation_equals_recomputation_beyond_the_training_length(name):
    torch.manual_seed(0)
    options = {"interpolate_to": 64} if name == "learned" else {}
    cfg = model_config("cpu-tiny", vocab_size=97, train_length=8, positions={"name": name, **options})
    model = Decoder(cfg).eval()
    prompt = torch.randint(0, 97, (20,)).tolist()  # 2.5 x the training length
    cached = list(generate_tokens(model, prompt, 12, temperature=0, use_cache=True, prefill_chunk=7))
    recomputed = list(generate_tokens(model, prompt, 12, temperature=0, use_cache=False))
    assert cached == recomputed and len(cached) == 12


def test_sampling_is_seeded_and_stops_at_end_of_text():
    torch.manual_seed(0)
    model = Decoder(model_config("cpu-tiny", vocab_size=50, positions={"name": "rope"})).eval()
    a = list(generate_tokens(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=7))
    b = list(generate_tokens(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=7))
    assert a == b
    stop = a[4]
    c = list(generate_tokens(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=7, eot_id=stop))
    assert c == a[: a.index(stop) + 1]


def test_top_k_and_top_p_filters():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert torch.isfinite(filter_logits(logits, 1.0, 2, None)).tolist() == [True, True, False, False, False]
    p = torch.softmax(logits, -1)  # [0.64, 0.24, 0.09, ...]: top_p 0.8 keeps the first two
    assert p[0] < 0.8 < p[0] + p[1]
    assert torch.isfinite(filter_logits(logits, 1.0, None, 0.8)).tolist() == [True, True, False, False, False]


def test_generate_cli_streams_a_continuation(tiny_data, tmp_path, capsys):
    from extrapos.cli import main
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    train(
        load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 3})),
        tmp_path / "run",
        progress=False,
    )
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                str(tmp_path / "run"),
                "--prompt",
                "Fellow citizens, " * 20,
                "--max-new-tokens",
                "16",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("Fellow citizens, ") and len(out) > len("Fellow citizens, " * 20)
    # into a pipe or a file: exactly the prompt and the generated text, no newline of the command's own;
    # greedy by default, as transformers' generate
    from extrapos.inference.generate import generate_text

    prompt, run = "Fellow citizens, " * 20, str(tmp_path / "run")
    greedy = generate_text(run, prompt, 16, temperature=0.0, progress=False)
    assert out == prompt + greedy
    # sampling when asked: --do-sample (temperature 1.0, top-k 50) or a temperature above 0
    for asked, temperature in ((["--do-sample"], 1.0), (["--temperature", "0.7"], 0.7)):
        assert (
            main(["generate", run, "--prompt", prompt, "--max-new-tokens", "16", "--seed", "3", *asked]) == 0
        )
        sampled = generate_text(run, prompt, 16, temperature=temperature, top_k=50, seed=3, progress=False)
        assert capsys.readouterr().out == prompt + sampled and sampled != greedy
    assert main(["generate", run]) == 2
    assert main(["generate", run, "--prompt", "x", "--top-p", "0.9"]) == 2  # greedy would ignore it
    assert "add --do-sample" in capsys.readouterr().err
    assert main(["generate", run, "--prompt", "x", "--do-sample", "--temperature", "0"]) == 2
    assert "drop one of them" in capsys.readouterr().err


def test_a_long_prefill_shows_progress_unless_told_not_to(capsys):
    """A prompt of several prefill chunks shows a bar over its tokens on stderr (the time before the first
    new token); progress=False, a short prompt, and the tokens themselves are unchanged by it."""
    torch.manual_seed(0)
    cfg = model_config("cpu-tiny", vocab_size=50, train_length=8, positions={"name": "rope"})
    model = Decoder(cfg).eval()
    prompt = torch.randint(0, 50, (40,)).tolist()
    shown = list(generate_tokens(model, prompt, 4, temperature=0, prefill_chunk=16, progress=True, label="r"))
    err = capsys.readouterr().err
    assert "prefill r" in err and "40/40" in err
    quiet = list(generate_tokens(model, prompt, 4, temperature=0, prefill_chunk=16, progress=False))
    short = list(generate_tokens(model, prompt[:10], 4, temperature=0, prefill_chunk=16, progress=True))
    assert capsys.readouterr().err == ""
    assert shown == quiet and len(short) == 4
