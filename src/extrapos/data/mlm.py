"""Masked language modelling as a batch transform (BERT, Devlin et al. 2019, §3.1 "Task #1: Masked LM").

Of every window's tokens, 15% are selected (special tokens never are); a selected token is
replaced by [MASK] 80% of the time, by a random token 10% of the time and kept 10% of the time,
and the loss counts the selected tokens only. An MLM ``Batch`` holds the corrupted text in
``tokens``, the original text in ``targets`` (the token at the same position, not the next one)
and the selection in ``loss_mask``, so the trainer's ``masked_loss_sum`` scores it unchanged.

The draw is a pure function of a key (training: sampler seed, rank and batch number; evaluation:
seed and span index) through NumPy's SeedSequence, and always consumes the same random numbers
whatever the text, so a resumed run masks exactly the batches it would have masked.

Windows are not wrapped in [CLS] ... [SEP]: training and evaluation windows are the decoders'
(text at positions 0..T-1), so the length-extrapolation protocol is unchanged; [CLS] and [SEP]
are added to the tokenizer for sentence embeddings and fine-tuning (docs/encoder.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from extrapos.data.batch import Batch
from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.sampling import Sampler
    from extrapos.data.tokenizer import Tokenizer

SELECT_RATE, MASK_SHARE, RANDOM_SHARE = 0.15, 0.8, 0.1  # BERT §3.1 / App. A.1
#: names an existing tokenizer may already use for each role, tried in order; else the first is added
ALIASES = {
    "cls": ("[CLS]", "<s>", "<|cls|>"),
    "sep": ("[SEP]", "</s>", "<|sep|>"),
    "mask": ("[MASK]", "<mask>", "<|mask|>"),
    "pad": ("[PAD]", "<pad>", "<|pad|>"),
}
#: a constant mixed into every key, so these draws never coincide with another stream of the same seed
_STREAM = 0x4D4C4D


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the encoder's special tokens (and the end-of-text token documents are joined by)."""

    cls: int
    sep: int
    mask: int
    pad: int
    eot: int

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(sorted({self.cls, self.sep, self.mask, self.pad, self.eot}))


def encoder_special_tokens(tokenizer: Tokenizer) -> SpecialTokens:
    """The [CLS], [SEP], [MASK], [PAD] ids of ``tokenizer``: existing tokens under a known name
    (``ALIASES``: a trained bpe:N already has <|mask|> and <|pad|>), the others added to it."""
    found = {
        role: next((i for i in map(tokenizer.token_id, names) if i is not None), None)
        for role, names in ALIASES.items()
    }
    missing = [ALIASES[role][0] for role, i in found.items() if i is None]
    if missing:
        tokenizer.add_special_tokens(missing)
        for role, names in ALIASES.items():
            if found[role] is None:
                found[role] = tokenizer.token_id(names[0])
    ids: dict[str, int] = {}
    for role, i in found.items():
        assert i is not None, role  # present, or added just above
        ids[role] = i
    return SpecialTokens(eot=tokenizer.eot_id, **ids)


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    specials: SpecialTokens,
    vocab_size: int,
    rate: float = SELECT_RATE,
) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted tokens, selected) for an int array of any shape; see the module docstring.

    Random replacements are uniform over the ``vocab_size`` ids that are not special tokens.
    """
    ids = specials.ids
    selected = (rng.random(tokens.shape) < rate) & ~np.isin(tokens, ids)
    kind = rng.random(tokens.shape)
    replacement = rng.integers(0, vocab_size - len(ids), tokens.shape)
    for s in ids:  # ascending: maps [0, V - n) one to one onto the non-special ids
        replacement += replacement >= s
    out = np.where(selected & (kind < MASK_SHARE), specials.mask, tokens)
    out = np.where(selected & (kind >= MASK_SHARE) & (kind < MASK_SHARE + RANDOM_SHARE), replacement, out)
    return out.astype(np.int64), selected


def rng_for(key: Sequence[int]) -> np.random.Generator:
    """The generator of one masking draw, a pure function of ``key``."""
    return np.random.default_rng([*(int(k) for k in key), _STREAM])


def mask_batch(
    batch: Batch, key: Sequence[int], specials: SpecialTokens, vocab_size: int, rate: float = SELECT_RATE
) -> Batch:
    """An MLM batch from a window batch: its ``tokens`` masked (the draw keyed by ``key``)."""
    text = batch.tokens.cpu().numpy()
    corrupted, selected = mask_tokens(text, rng_for(key), specials, vocab_size, rate)
    return Batch(
        torch.from_numpy(corrupted), batch.tokens.clone(), batch.positions, torch.from_numpy(selected)
    )


class MLMSampler:
    """A window sampler whose batches are masked; the draw of batch n is keyed by (seed, rank, n).

    Everything else (epochs, sharding, ``windows_per_epoch``) is the wrapped sampler's; the state
    adds the batch count, so resuming continues both streams exactly. ``rate`` is the share of
    tokens selected: BERT's 15% by default; small models on short budgets learn faster at 40%
    (Wettig et al. 2023, "Should You Mask 15% in Masked Language Modeling?").
    """

    def __init__(self, inner: Sampler, specials: SpecialTokens, vocab_size: int, rate: float = SELECT_RATE):
        self.inner, self.specials, self.vocab_size, self.rate = inner, specials, vocab_size, rate
        self.batches = 0

    def __getattr__(self, name: str) -> Any:  # only called for names this wrapper does not have
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def next_batch(self) -> Batch:
        key = (self.inner.seed, self.inner.rank, self.batches)
        self.batches += 1
        return mask_batch(self.inner.next_batch(), key, self.specials, self.vocab_size, self.rate)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {**self.inner.state_dict(), "mlm_batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        if "mlm_batches" not in state:
            raise UserError(
                "Cannot resume the data stream: the checkpoint was not trained with objective mlm."
            )
        self.batches = int(state.pop("mlm_batches"))
        self.inner.load_state_dict(state)


def objective_sampler(
    objective: str,
    sampler: Sampler,
    tokenizer: Tokenizer | None = None,
    model_vocab_size: int | None = None,
    mask_rate: float = SELECT_RATE,
) -> Any:
    # Sampler | MLMSampler; Any until training/trainer.py is annotated (issue 45): it assigns the result
    # to a variable that holds a ContiguousSampler
    """``sampler`` for objective "lm"; for "mlm", its batches masked (``mask_rate`` of the tokens
    selected), with the encoder's special tokens added to ``tokenizer`` (default: the sampler's data
    directory's, which is then only read)."""
    if objective != "mlm":
        return sampler
    if tokenizer is None:
        from extrapos.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(sampler.split.directory)
    specials = encoder_special_tokens(tokenizer)
    if model_vocab_size is not None and tokenizer.vocab_size > model_vocab_size:
        raise UserError(
            f"the tokenizer with the encoder's special tokens has {tokenizer.vocab_size} tokens but "
            f"model.vocab_size is {model_vocab_size}; set model.vocab_size={tokenizer.vocab_size} "
            "or more."
        )
    return MLMSampler(sampler, specials, tokenizer.vocab_size, mask_rate)
