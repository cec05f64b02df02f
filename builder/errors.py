"""Errors a user can act on. The CLI prints each as one line and exits non-zero."""


class BuilderError(Exception):
    """A failure with a message that names the file, patch or setting at fault."""
