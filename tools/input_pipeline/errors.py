"""The input pipeline's one error type."""


class DataError(Exception):
    """Input data that cannot be used; the message names the file or flag."""
