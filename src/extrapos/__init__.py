"""extrapos: positional encodings for length extrapolation (train short, test long)."""

__version__ = "0.1.0"

# transformers' Auto classes learn model_type "extrapos" (exported folders) when transformers loads them
from extrapos.integrations.hf_remote import registration as _hf_registration  # noqa: E402

_hf_registration.install()
