"""What a Hugging Face caller passes to an extrapos model and expects honoured (issue 46): an
`attention_mask` with padding on either side gives each row's tokens the logits they get alone,
`output_hidden_states=True` returns every block's input and the final states, a folder exported by
another extrapos version warns once on load, and a run loads in Python as a transformers model without
an export (the route docs/huggingface.md shows)."""

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from extrapos.integrations.hf import export_pretrained  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import VOCAB, make_run, ours_logits  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("inputs")
    make_run(base / "run", positions={"name": "cable"})
    return export_pretrained(base / "run", base / "hf", remote_code=True)


def _load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


def test_padding_on_either_side_leaves_each_rows_logits_as_alone(folder):
    model = _load(folder)
    torch.manual_seed(0)
    a, b = torch.randint(1, VOCAB, (12,)), torch.randint(1, VOCAB, (7,))
    pad = torch.zeros(5, dtype=torch.long)
    ones, zeros = torch.ones(7, dtype=torch.long), torch.zeros(5, dtype=torch.long)
    with torch.no_grad():
        alone = [model(input_ids=x[None]).logits[0] for x in (a, b)]
        right = model(
            input_ids=torch.stack([a, torch.cat([b, pad])]),
            attention_mask=torch.stack([torch.ones(12, dtype=torch.long), torch.cat([ones, zeros])]),
        ).logits
        left = model(
            input_ids=torch.stack([a, torch.cat([pad, b])]),
            attention_mask=torch.stack([torch.ones(12, dtype=torch.long), torch.cat([zeros, ones])]),
        ).logits
    assert (right[0] - alone[0]).abs().max() < TOL and (left[0] - alone[0]).abs().max() < TOL
    assert (right[1, :7] - alone[1]).abs().max() < TOL
    assert (left[1, 5:] - alone[1]).abs().max() < TOL


def test_output_hidden_states_returns_every_blocks_input_and_the_final_states(folder, tmp_path):
    model = _load(folder)
    run = load_run(folder.parent / "run")
    tokens = torch.randint(0, VOCAB, (2, 20))
    positions = torch.arange(20).expand(2, -1)
    with torch.no_grad():
        out = model(input_ids=tokens, output_hidden_states=True)
        plain = model(input_ids=tokens)
        base = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)(
            input_ids=tokens, output_hidden_states=True
        )
        embedded = run.model.pos.embed(run.model.tok_emb(tokens), positions)
        final = run.model.hidden_states(tokens, positions)
    states = out.hidden_states
    assert states is not None and len(states) == run.model.cfg.n_layers + 1
    assert (states[0] - embedded).abs().max() < TOL  # the embeddings, as the first block receives them
    assert (states[-1] - final).abs().max() < TOL
    assert not torch.equal(states[1], states[0])
    assert (out.logits - plain.logits).abs().max() == 0 and plain.hidden_states is None
    assert len(base.hidden_states) == len(states) and torch.equal(
        base.hidden_states[-1], base.last_hidden_state
    )


def test_a_folder_of_another_extrapos_version_warns_once_on_load(folder, tmp_path):
    import shutil

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same version: no warning of ours
        try:
            _load(folder)
        except UserWarning as e:
            assert "exported by extrapos" not in str(e)
    other = tmp_path / "old"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config["extrapos_version"] = "0.0.1"
    (other / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load(other)
    ours = [w for w in caught if "exported by extrapos 0.0.1" in str(w.message)]
    assert len(ours) == 1
    assert "install extrapos==0.0.1 or export the run again" in str(ours[0].message)


def test_a_run_loads_in_python_as_a_transformers_model_without_an_export(folder):
    """The snippet of docs/huggingface.md: input_ids and attention_mask in, logits and a cache out."""
    from extrapos.integrations.hf_remote.from_run import model_from_run, tokenizer_from_run

    run_dir = folder.parent / "run"
    model = model_from_run(run_dir)
    tokenizer = tokenizer_from_run(run_dir)
    assert isinstance(model, transformers.PreTrainedModel)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    tokenizer.padding_side = "left"  # prompts continue from their last token, as generate pads them
    batch = tokenizer(["Fellow citizens of the Senate", "We the people"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=True)
    run = load_run(run_dir)
    longest = batch.input_ids[:1]  # the longer prompt has no padding
    assert (out.logits[:1] - ours_logits(run.model, longest)).abs().max() < TOL
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    assert cache.get_seq_length() == batch.input_ids.shape[1]
    more = torch.tensor([[17], [23]])
    mask = torch.cat([batch.attention_mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    with torch.no_grad():
        step = model(input_ids=more, attention_mask=mask, cache=cache, use_cache=True)
        whole = model(input_ids=torch.cat([batch.input_ids, more], 1), attention_mask=mask)
    assert (step.logits[:, -1] - whole.logits[:, -1]).abs().max() < TOL
    exported = _load(folder)
    with torch.no_grad():
        assert torch.equal(exported(**batch).logits, model(**batch).logits)


def test_lm_evals_hf_backend_takes_the_in_process_model(folder):
    """HFLM(pretrained=model, tokenizer=tokenizer): a log-likelihood equal to the library's own."""
    import torch.nn.functional as F
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from extrapos.integrations.hf_remote.from_run import model_from_run, tokenizer_from_run

    run_dir = folder.parent / "run"
    lm = HFLM(pretrained=model_from_run(run_dir), tokenizer=tokenizer_from_run(run_dir), batch_size=2)
    context, continuation = "Fellow citizens of", " the Senate"
    [(got, _)] = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    run = load_run(run_dir)
    whole, n = run.tokenizer.encode(context + continuation), len(run.tokenizer.encode(context))
    logp = F.log_softmax(ours_logits(run.model, torch.tensor([whole[:-1]]))[0], -1)
    assert got == pytest.approx(float(sum(logp[t - 1, whole[t]] for t in range(n, len(whole)))), abs=1e-4)
