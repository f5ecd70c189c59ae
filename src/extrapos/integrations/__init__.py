"""Bridges from extrapos runs to other evaluation tools (lm-evaluation-harness)."""
