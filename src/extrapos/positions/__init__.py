"""Positional encodings behind one protocol (see base.py) and a registry (see registry.py)."""

from extrapos.positions.base import EncodingContext, FoldedBias, LogitBias, PairwiseBias, PositionalEncoding
from extrapos.positions.registry import build_encoding, names, register, spec

__all__ = [
    "EncodingContext",
    "FoldedBias",
    "LogitBias",
    "PairwiseBias",
    "PositionalEncoding",
    "build_encoding",
    "names",
    "register",
    "spec",
]
