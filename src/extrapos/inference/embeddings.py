"""Sentence embeddings of texts from an encoder run, for retrieval: mean-pooled or [CLS].

A text becomes BERT's single-sentence input ``[CLS] text [SEP]`` (Devlin et al. 2019, §3: "The first
token of every sequence is always a special classification token ([CLS])"; the ids are the run's own,
``data/mlm.py``),
truncated to ``max_length`` tokens with its [SEP] kept, at positions 0..n-1. Its embedding is the mean
of the encoder's final hidden states over all of its tokens ([CLS] and [SEP] included, as
sentence-transformers' mean pooling counts every non-padding token; Reimers & Gurevych 2019, §3: MEAN
is their default), or the hidden state of [CLS] (BERT's sentence-level representation, §3), optionally
L2-normalised.

Padding never changes a text's embedding: texts are run in groups of equal token count, so no text
is ever padded. A key-padding mask alone would not be enough in this library: some bidirectional
encodings read the sequence itself, not only the visible keys (bidirectional FIRE normalises by each
query's farthest key, ``reach_i``, docs/encoder.md), so a padded text would see a different bias.
The same ``token_states`` runs inside the sentence-transformers module
(``integrations/sentence_transformers.py``), so an export embeds texts exactly as this module does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.mlm import SpecialTokens
    from extrapos.data.tokenizer import Tokenizer
    from extrapos.model import Decoder
    from extrapos.run.handle import LoadedRun

POOLINGS = ("mean", "cls")


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise UserError(f"pooling must be mean or cls, got {pooling!r}.")
    return pooling


def check_max_length(max_length: int, wrap: bool = True) -> int:
    least = 3 if wrap else 1
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < least:
        raise UserError(
            f"the maximum text length must be an integer of at least {least} tokens"
            + (" ([CLS], one token of text, [SEP])" if wrap else "")
            + f", got {max_length!r}."
        )
    return max_length


def text_ids(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_length: int,
    specials: SpecialTokens | None = None,
    wrap: bool = True,
) -> list[list[int]]:
    """Each text's token ids: ``[CLS] text [SEP]`` truncated to ``max_length`` tokens (the [SEP] kept);
    with ``wrap`` False, the text's own tokens only. ``specials``: the run's ``SpecialTokens`` (found or
    added to ``tokenizer`` when None)."""
    from extrapos.data.mlm import encoder_special_tokens

    check_max_length(max_length, wrap)
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise UserError("texts must be a list of strings.")
    ids = tokenizer.encode_batch(list(texts)) if texts else []
    if not wrap:
        return [list(x[:max_length]) for x in ids]
    specials = specials or encoder_special_tokens(tokenizer)
    return [[specials.cls, *x[: max_length - 2], specials.sep] for x in ids]


def token_states(model: Decoder, ids: Sequence[Sequence[int]], batch_size: int = 32) -> list[Tensor]:
    """The final hidden states (n_i, d) of each sequence of ``ids``, in order; differentiable (call it under
    ``torch.no_grad`` to embed). Sequences of equal length run together, ``batch_size`` at a time, at
    positions 0..n-1; none is padded (module docstring)."""
    if batch_size < 1:
        raise UserError(f"the batch size must be positive, got {batch_size}.")
    if any(len(x) == 0 for x in ids):
        raise UserError("every text needs at least one token; drop the empty ones or keep [CLS]/[SEP].")
    device = next(model.parameters()).device
    out: list[Tensor | None] = [None] * len(ids)
    by_length: dict[int, list[int]] = {}
    for i, x in enumerate(ids):
        by_length.setdefault(len(x), []).append(i)
    for n, members in sorted(by_length.items()):
        positions = torch.arange(n, device=device).unsqueeze(0)
        for s in range(0, len(members), batch_size):
            chunk = members[s : s + batch_size]
            tokens = torch.tensor([list(ids[i]) for i in chunk], dtype=torch.long, device=device)
            h = model.hidden_states(tokens, positions.expand(len(chunk), -1))
            for row, i in enumerate(chunk):
                out[i] = h[row]
    return out  # type: ignore[return-value]


def pool(states: Sequence[Tensor], pooling: str = "mean", normalize: bool = False) -> Tensor:
    """(B, d) sentence embeddings from each text's (n_i, d) states: their mean, or the first ([CLS])."""
    check_pooling(pooling)
    if not states:
        raise UserError("there are no texts to embed.")
    rows = [s.mean(0) if pooling == "mean" else s[0] for s in states]
    out = torch.stack(rows)
    return torch.nn.functional.normalize(out, dim=-1) if normalize else out


def embed_texts(
    run: str | Path | LoadedRun,
    texts: Sequence[str],
    pooling: str = "mean",
    max_length: int | None = None,
    batch_size: int = 32,
    normalize: bool = False,
    device: str = "cpu",
    step: int | None = None,
) -> np.ndarray:
    """Sentence embeddings (len(texts), d_model) float32 of ``texts`` from an encoder run.

    ``run``: a run directory (its latest checkpoint, or ``step``) or a ``LoadedRun``; the run's own
    tokenizer. ``max_length``: tokens per text including [CLS] and [SEP] (default: the run's training
    length L_t; longer is length extrapolation, as the encoding allows). See the module docstring.
    """
    from extrapos.data.mlm import encoder_special_tokens
    from extrapos.run.directory import LoadedRun, load_run

    check_pooling(pooling)
    if not isinstance(run, LoadedRun):
        run = load_run(encoder_run_dir(run), device=device, step=step)
    if run.cfg.model.causal:
        raise UserError(
            f"{run.path} is a decoder run; sentence embeddings need an encoder (model.flavour encoder, "
            "train.objective mlm)."
        )
    if len(texts) == 0:
        return np.zeros((0, run.cfg.model.d_model), dtype=np.float32)
    length = run.cfg.model.train_length if max_length is None else max_length
    ids = text_ids(run.tokenizer, texts, length, encoder_special_tokens(run.tokenizer))
    was_training = run.model.training
    run.model.eval()
    try:
        with torch.no_grad():
            emb = pool(token_states(run.model, ids, batch_size), pooling, normalize)
    finally:
        run.model.train(was_training)
    return emb.float().cpu().numpy()


def encoder_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` checked to hold an encoder run (before any weights are read)."""
    from extrapos.run.config import load_run_config

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    if cfg.model.flavour != "encoder":
        raise UserError(
            f"{run_dir} is a decoder run ({cfg.model.flavour}); sentence embeddings need an encoder "
            "(model.flavour encoder, train.objective mlm)."
        )
    return run_dir
