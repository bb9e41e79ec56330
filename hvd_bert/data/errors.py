"""The data errors every reader raises (``hvd_bert.data.records`` re-exports them): one line
naming the file and the fix, a user error (exit status 2)."""

__all__ = ["DatasetError", "CorruptRecordError"]


class DatasetError(ValueError):
    """A dataset folder that is missing, empty, or does not match what the reader expects."""


class CorruptRecordError(DatasetError):
    """A record whose CRC does not match, or a file that ends inside a record."""
