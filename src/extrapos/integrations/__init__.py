"""Bridges to other libraries: Hugging Face checkpoints (hf/, one adapter per architecture),
lm-evaluation-harness (lm_eval.py) and sentence-transformers (sentence_transformers.py: an encoder run as
an embedding model).

Each is imported lazily by the command that needs it: each needs its own optional packages.
"""
