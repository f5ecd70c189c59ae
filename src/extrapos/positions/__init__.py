"""Positional encodings behind one protocol (see base.py) and a registry (see registry.py)."""

from extrapos.positions.base import EncodingContext, FoldedBias, PairwiseBias, PositionalEncoding
from extrapos.positions.registry import build_encoding, names, register, spec

__all__ = [
    "EncodingContext",
    "FoldedBias",
    "PairwiseBias",
    "PositionalEncoding",
    "build_encoding",
    "names",
    "register",
    "spec",
]
