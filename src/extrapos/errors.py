"""User-facing errors: one clear sentence that names the fix, never a traceback."""


class UserError(Exception):
    """A mistake the user can fix (bad path, unknown name, too-short corpus...).

    The CLI prints ``str(error)`` alone and exits with status 2; library callers can catch it.
    """
