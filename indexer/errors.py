"""Typed errors of the indexer (the CLI turns them into a message and exit code 2)."""

from __future__ import annotations


class IndexerError(RuntimeError):
    """Base of the indexer's errors."""


class SourceError(IndexerError):
    """A source (folder, manifest, catalogue) is missing or malformed; the message names the file/line."""


class BuildError(IndexerError):
    """A build, add or delete cannot complete; nothing was published."""


class TooManyBadItemsError(BuildError):
    """The share of bad items passed the threshold; nothing was published."""


class DiskSpaceError(BuildError):
    """The index's filesystem has too little free space for an operation; the message names the path, the
    space needed and the space free. Nothing was published."""
