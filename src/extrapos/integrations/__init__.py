"""Bridges to other libraries: Hugging Face checkpoints (hf.py) and lm-evaluation-harness (lm_eval.py).

Each is imported lazily by the command that needs it: each needs its own optional packages.
"""
