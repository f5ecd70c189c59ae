"""extrapos: positional encodings for length extrapolation (train short, test long)."""

__version__ = "0.1.0"

# transformers' Auto classes learn model_type "extrapos" (exported folders) when transformers loads them
from extrapos import auto_registration as _auto_registration

_auto_registration.install()
