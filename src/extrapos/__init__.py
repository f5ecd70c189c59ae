"""extrapos: positional encodings for length extrapolation (train short, test long)."""

import logging as _logging

# transformers' Auto classes learn model_type "extrapos" (exported folders) when transformers loads them
from extrapos import auto_registration as _auto_registration

__version__ = "0.1.0"

# a library says what it does through logging and prints nothing of its own: a program hears the
# ``extrapos.*`` loggers once it configures logging, a command through console.py's handler
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

_auto_registration.install()
