"""User-facing errors: one clear sentence that names the fix, never a traceback."""


class UserError(Exception):
    """A mistake the user can fix (bad path, unknown name, too-short corpus...).

    The CLI prints ``str(error)`` alone and exits with status 2; library callers can catch it.
    """


# The exit status of an unexpected exception (a defect of extrapos, not the user's mistake): sysexits.h's
# EX_SOFTWARE, distinct from 2 (a UserError or a command-line mistake) and 130 (interrupted).
INTERNAL_ERROR = 70
