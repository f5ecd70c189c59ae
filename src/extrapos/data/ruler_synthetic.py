"""``synthetic:ruler``: training examples of RULER's tasks (Hsieh et al. 2024) from the generator `extrapos
ruler` scores with, so a small model can be trained on the tasks it is then tested on.

Each example is one of the 11 tasks that need no data (QA's must be provided), drawn uniformly, in the word
vocabulary of ``ruler_prompts.synthetic_tokenizer``, with the short template (the answer prefix only), the
noise or built-in essay haystack its task names and the sizes of the spec; the answer and an end-of-text
token end it and carry the loss, so a trained model learns to stop after the answer it generates.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from extrapos.data.ruler_tasks import SYNTHETIC_TASKS, RulerShape

if TYPE_CHECKING:
    from extrapos.data.ruler_prompts import RulerBuilder


@lru_cache(maxsize=8)
def builder(shape: RulerShape) -> RulerBuilder:
    """The word-vocabulary builder of ``shape`` (one per shape: the essay is encoded once)."""
    from extrapos.data import ruler_words
    from extrapos.data.ruler_prompts import Essay, RulerBuilder, synthetic_tokenizer

    tok = synthetic_tokenizer()
    return RulerBuilder(tok, shape, Essay(tok, ruler_words.synthetic_essay(), "builtin"))


@lru_cache(maxsize=8)
def shortest(shape: RulerShape) -> int:
    """The shortest prompt-and-answer length that every training task fits in."""
    b = builder(shape)
    return max(b.min_length(t) for t in SYNTHETIC_TASKS)


def example(shape: RulerShape, total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One example of ``total`` tokens: (ids int64, answer flags bool), the answer and end-of-text flagged."""
    b = builder(shape)
    task = SYNTHETIC_TASKS[int(rng.integers(0, len(SYNTHETIC_TASKS)))]
    p = b.build(task, total - 2, rng)  # prompt + target = total - 1, then the end-of-text token
    ids = np.asarray(p.tokens + p.target + [b.tok.eot_id], dtype=np.int64)
    flags = np.zeros(len(ids), dtype=bool)
    flags[len(p.tokens) :] = True
    return ids, flags
