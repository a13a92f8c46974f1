"""The project's own error type: anything a user can cause (bad path, broken trace, bad SQL)."""


class TraceError(Exception):
    """Unusable input. The message is one line, fit to print as is."""
