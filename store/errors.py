"""The store's typed errors (``service.errors`` maps them to HTTP answers, the CLIs to exit codes)."""

from __future__ import annotations


class IndexFormatError(RuntimeError):
    """An index on disk is missing, malformed, or does not fit the request."""


class IndexNotFoundError(IndexFormatError):
    """No such index, no published version, or no such version."""


class ModelMismatchError(IndexFormatError):
    """The index was built with another model than the one in use; the message names both."""


class FilterError(IndexFormatError):
    """A metadata filter names an unknown field or has a malformed value; the message names the field."""


class VersionWriteError(IndexFormatError):
    """A version could not be written as asked (rows or shapes that do not add up, a manifest of another
    version): a writer's bug, caught before anything was published."""


class IndexUnreachableError(IndexFormatError):
    """Part of a version served elsewhere (a shard on other machines) did not answer in time, or every replica
    asked died: the files may be fine, and the same call may succeed later (a version that failed to open so
    is tried again at the next poll, unlike a broken one)."""


class ChangeLogError(IndexFormatError):
    """An index's live change log (``store.live``) cannot be read or written as asked."""


class ChangeLogCorruptError(ChangeLogError):
    """A record of the change log (or the log's file) is damaged: it does not parse, fails its checksum, or
    holds what no writer writes. The message names the log and the sequence number."""


class ChangeLogGapError(ChangeLogError):
    """The entries right after what a served version holds are gone from the change log (folded and
    dropped while the version was still served: one older than every version kept). Applying the later
    ones would skip changes in silence, so none is applied; a newer version holds them."""


class ChangeLogUnavailableError(ChangeLogError, IndexUnreachableError):
    """The change log did not answer in time (another writer held it past the busy timeout, the database is
    down or unreachable): nothing was written, and the same call may succeed later (a write route answers
    503 with ``Retry-After``; it never drops the write in silence)."""


class InvalidChangeError(ValueError):
    """A change that cannot be recorded (an empty id, a value that is not JSON, a malformed photo digest):
    the caller's input, refused before anything is written. ``field`` names the part at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PhotoUnreadableError(IndexFormatError):
    """A photo a change names is missing from the index's photo store, or its bytes are not those its
    digest names (``store.live.photos``)."""
