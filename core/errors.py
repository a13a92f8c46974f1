"""The project's own error type: anything a user can cause (bad path, broken trace, bad SQL)."""


class TraceError(Exception):
    """Unusable input. The message is one line, fit to print as is: newlines and runs of
    whitespace in it (pyarrow's and DuckDB's messages span several lines) become one space."""

    def __init__(self, message: object = "") -> None:
        super().__init__(" ".join(str(message).split()))
