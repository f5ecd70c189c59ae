"""Bridges to other libraries' model formats (imported lazily: each needs its own optional packages)."""
