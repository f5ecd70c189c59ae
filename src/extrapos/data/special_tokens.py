"""The special tokens of the synthetic vocabularies (ids 0, 1, 2 in this order): end-of-text, padding and
the mask / unknown token. Their own module because both synthetic tokenizers use them: the word-level one
of data/synthetic.py and RULER's of data/ruler_prompts.py, which synthetic.py builds for `synthetic:ruler`."""

SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
