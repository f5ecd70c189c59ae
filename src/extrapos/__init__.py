"""extrapos: positional encodings for length extrapolation (train short, test long)."""

__version__ = "0.1.0"
