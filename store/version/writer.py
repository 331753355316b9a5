"""Writing one index version: ``VersionWriter`` owns the sequence every writer follows (the indexer's
build, add and delete, the benchmarks, the test fixtures), so the files of a version are written one way:

    stage in NAME/.builds/<version>  ->  arrays (embeddings.npy, rerank_tokens.npy [+ rerank_scales.npy])
    ->  metadata.sqlite  ->  index.faiss  ->  checksums + manifest.json  ->  install (one rename)
    ->  publish (switch CURRENT; not when the quality gate refused)  ->  prune

Safety kept from the builder: arrays are preallocated and written with plain writes, never through a
writable memory map (``store.files``), and every disk-full failure names its file. A failure before
publishing removes the staged version, and a publish that fails removes the version just installed:
CURRENT, and the version it names, stay untouched.

One writer per index at a time is the caller's duty, not this class's: the indexer holds its per-index lock
(``indexer.staging.index_lock``) for a whole operation, from reading CURRENT and encoding shards (work this
package knows nothing of) to pruning, and the failure policy around it (which shard work to keep, how a
full disk is explained) is the indexer's too. Fixtures and benchmarks write alone.

A sharded version is written the same way by ``store.shards.sharded_writer.ShardedVersionWriter``: its shards
are
staged as ordinary version folders inside the one stage, which is installed and published once.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import faiss
import numpy as np

from store.errors import IndexFormatError, VersionWriteError
from store.files import NpyWriter, link_or_copy, names_full_disk, write_sparse_zeros
from store.layout import (
    CURRENT_FILE,
    EMBEDDINGS_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    METADATA_FILE,
    RERANK_FILE,
    RERANK_SCALES_FILE,
    builds_dir,
    file_checksums,
    index_dir,
    sha256_file,
)
from store.version import metadata, versions
from store.version.manifest import IndexManifest


class VersionArrays:
    """The embeddings and re-rank store of a version being written, filled in row order from a parent
    version's files (``copy_from``) and/or blocks (``append``). ``tokens == 0`` (a model without a fusion
    encoder): no re-rank store. ``zero_rerank``: the store is an all-zero sparse file of the real shape
    (benchmarks: nothing written), and ``append`` takes embeddings only."""

    def __init__(
        self,
        stage: Path,
        rows: int,
        dim: int,
        *,
        tokens: int = 0,
        width: int = 0,
        rerank_dtype: str = "fp16",
        zero_rerank: bool = False,
    ) -> None:
        has_store = tokens > 0
        if has_store and rerank_dtype not in ("fp16", "int8"):
            raise VersionWriteError(f"internal: re-rank dtype {rerank_dtype!r} is neither fp16 nor int8")
        tok_dtype = np.float16 if rerank_dtype == "fp16" else np.int8
        self._tok: NpyWriter | None = None
        self._scales: NpyWriter | None = None
        with contextlib.ExitStack() as files:  # a failure here closes the files opened so far
            self._emb = files.enter_context(NpyWriter(stage / EMBEDDINGS_FILE, np.float32, (rows, dim)))
            if has_store and zero_rerank:
                write_sparse_zeros(stage / RERANK_FILE, tok_dtype, (rows, tokens, width))
                if rerank_dtype == "int8":
                    write_sparse_zeros(stage / RERANK_SCALES_FILE, np.float32, (rows, tokens))
            elif has_store:
                self._tok = files.enter_context(
                    NpyWriter(stage / RERANK_FILE, tok_dtype, (rows, tokens, width))
                )
                if rerank_dtype == "int8":
                    self._scales = files.enter_context(
                        NpyWriter(stage / RERANK_SCALES_FILE, np.float32, (rows, tokens))
                    )
            self._files = files.pop_all()

    def append(
        self, embeds: np.ndarray, tokens: np.ndarray | None = None, scales: np.ndarray | None = None
    ) -> None:
        """The next rows: (m, D) embeddings, (m, T, W) tokens and, for int8, their (m, T) scales."""
        self._emb.append(embeds)
        if self._tok is not None:
            if tokens is None:
                raise VersionWriteError("internal: this version has a re-rank store: append needs tokens")
            self._tok.append(tokens)
        if self._scales is not None and scales is not None:
            self._scales.append(scales)

    def copy_from(self, version_dir: Path) -> None:
        """Every row of an installed version's arrays (a parent's, for ``add``), in bounded chunks."""
        version_dir = Path(version_dir)
        self._emb.copy_from(np.load(version_dir / EMBEDDINGS_FILE, mmap_mode="r"))
        if self._tok is not None:
            self._tok.copy_from(np.load(version_dir / RERANK_FILE, mmap_mode="r"))
        if self._scales is not None:
            self._scales.copy_from(np.load(version_dir / RERANK_SCALES_FILE, mmap_mode="r"))

    def __enter__(self) -> VersionArrays:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Each file checks its row count and fsyncs (or just closes, after a failure).
        self._files.__exit__(kind, exc, tb)


@dataclass
class Finished:
    """What ``VersionWriter.finish`` did."""

    version: str
    path: Path  # NAME/<version>
    published: bool
    pruned: list[str] = field(default_factory=list)


class StagedFiles:
    """The files of one version folder being written under ``stage`` (an unsharded version's, or one shard's
    inside a sharded version's stage, ``store.shards.sharded_writer``): arrays, metadata, the ANN index, files
    linked from a parent."""

    stage: Path

    def arrays(
        self,
        rows: int,
        dim: int,
        *,
        tokens: int = 0,
        width: int = 0,
        rerank_dtype: str = "fp16",
        zero_rerank: bool = False,
    ) -> VersionArrays:
        """The embeddings and re-rank store for ``rows`` rows, written as a ``with`` block
        (``VersionArrays``)."""
        return VersionArrays(
            self.stage,
            rows,
            dim,
            tokens=tokens,
            width=width,
            rerank_dtype=rerank_dtype,
            zero_rerank=zero_rerank,
        )

    def save_arrays(
        self, embeds: np.ndarray, tokens: np.ndarray | None = None, scales: np.ndarray | None = None
    ) -> None:
        """All arrays at once: (N, D) embeddings, (N, T, W) tokens (none: no re-rank store), stored fp16,
        or int8 when their (N, T) ``scales`` are given."""
        shape = (0, 0) if tokens is None else (int(tokens.shape[1]), int(tokens.shape[2]))
        dtype = "int8" if scales is not None else "fp16"
        n, d = int(embeds.shape[0]), int(embeds.shape[1])
        with self.arrays(n, d, tokens=shape[0], width=shape[1], rerank_dtype=dtype) as arrays:
            arrays.append(embeds, tokens, scales)

    def embeddings(self) -> np.ndarray:
        """The staged embeddings, memory-mapped read-only (to train and fill the ANN index)."""
        return np.load(self.stage / EMBEDDINGS_FILE, mmap_mode="r")

    def write_metadata(
        self,
        items: Iterable[metadata.MetadataRow | metadata.StoredRow],
        *,
        text_names: Iterable[str] = (),
    ) -> None:
        """metadata.sqlite from (row, id, path, fields, deleted), by row (``metadata.write_metadata``)."""
        with names_full_disk(self.stage / METADATA_FILE):
            metadata.write_metadata(self.stage / METADATA_FILE, items, text_names=text_names)

    def write_index(self, index: Any) -> None:
        """index.faiss (ids are rows)."""
        path = self.stage / INDEX_FILE
        with names_full_disk(path):
            faiss.write_index(index, str(path))

    def link_from(self, version_dir: Path, names: Iterable[str]) -> None:
        """Files of an installed version taken over unchanged (hard links; copies across filesystems).
        A linked file's checksum is the version's own (``linked_checksums``): not read again."""
        link_from_version(version_dir, self.stage, names, self.linked_checksums)

    @property
    def linked_checksums(self) -> dict[str, str]:
        """{file: sha256} of the files ``link_from`` linked, from their version's manifest."""
        return self.__dict__.setdefault("_linked_checksums", {})


def link_from_version(version_dir: Path, stage: Path, names: Iterable[str], known: dict[str, str]) -> None:
    """``link_version_files`` against the checksums the version's own manifest records (none when it cannot
    be read: each file is then hashed with the stage's own files)."""
    try:
        theirs = IndexManifest.load(Path(version_dir) / MANIFEST_FILE).checksums
    except IndexFormatError:
        theirs = {}
    link_version_files(version_dir, stage, names, theirs, known)


def link_version_files(
    version_dir: Path,
    stage: Path,
    names: Iterable[str],
    digests: Mapping[str, str],
    known: dict[str, str],
    *,
    error: type[Exception] = IndexFormatError,
) -> None:
    """Files ``names`` of an installed version taken over unchanged into ``stage`` (hard links; copies
    across filesystems); their checksums among ``digests`` (the version's manifest's) go into ``known``, not
    read again. A hard link shares the version's inode: the new manifest records what the file held when it
    was written, so a shared file that rotted since fails ``verify`` in both versions. A copy's bytes are
    new: one whose sha256 is not the recorded one (the version's file rotted) would be recorded as good, so
    ``error`` (the caller's type) is raised, naming the file; a verified copy's checksum goes into ``known``.
    A name that leaves the version folder, or one staged already, raises ``error``. All or nothing: any
    failure (a mismatch, a full disk part-way) removes the files this call created again and leaves ``known``
    as it was, so a caller that goes on with the stage (writes the files afresh) finds neither stale files
    nor their checksums."""
    folder, stage = Path(version_dir), Path(stage)
    sums: dict[str, str] = {}  # into ``known`` once every file is taken over
    taken: list[str] = []
    try:
        for fname in names:
            if Path(fname).is_absolute() or ".." in Path(fname).parts:  # a manifest's names stay inside
                raise error(f"{folder}: file name {fname!r} leaves the version folder")
            if (stage / fname).exists():  # a link fails there, and the copy would overwrite the stage's file
                raise error(f"internal: {stage / fname} is staged already")
            taken.append(fname)  # before linking: a copy that fails part-way goes too
            with names_full_disk(stage / fname):
                linked = link_or_copy(folder / fname, stage / fname)
            recorded = digests.get(fname)
            if recorded is None:
                continue  # not recorded: hashed with the stage's own files
            if not linked and sha256_file(stage / fname) != recorded:
                raise error(
                    f"{folder / fname}: checksum mismatch (the copy's bytes are not those the version "
                    "recorded)"
                )
            sums[fname] = recorded
    except BaseException:
        _remove_taken(stage, taken)
        raise
    known.update(sums)


def _remove_taken(stage: Path, taken: list[str]) -> None:
    """Undo a ``link_version_files`` that failed: the files it took over, and the nested folders it left
    empty (the caller may write them afresh)."""
    for name in taken:
        (stage / name).unlink(missing_ok=True)
    for folder in sorted({(stage / name).parent for name in taken}, key=lambda p: len(p.parts), reverse=True):
        if folder != stage:
            with contextlib.suppress(OSError):  # not empty: another's files
                folder.rmdir()


class StagedVersion:
    """A new version of index ``name`` under ``root`` being staged in ``NAME/.builds/<version>``; the one
    way both writers (``VersionWriter``, ``store.shards.sharded_writer.ShardedVersionWriter``) stage. Use it
    as a
    context manager: leaving it without finishing (a failure, or an early return) removes the stage."""

    def __init__(self, root: Path, name: str, *, version: str | None = None) -> None:
        self.root = Path(root)
        self.name = name
        self.version = version or versions.new_version_name(self.root, name)
        self.stage = builds_dir(self.root, name) / self.version
        if self.stage.exists():
            shutil.rmtree(self.stage)
        self.stage.mkdir(parents=True)
        self._finished: Finished | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()

    def abort(self) -> None:
        """Remove the staged version (a no-op once it is installed)."""
        shutil.rmtree(self.stage, ignore_errors=True)


class VersionWriter(StagedVersion, StagedFiles):
    """Writes one new version of index ``name`` under ``root`` (see the module docstring). Use it as a
    context manager: leaving it without ``finish`` (a failure, or an early return) removes the staged
    version."""

    # -- finishing -----------------------------------------------------------------------------------------

    def finish(
        self,
        manifest: IndexManifest,
        *,
        publish: bool = True,
        keep: int | None = None,
        checksums: bool = True,
    ) -> Finished:
        """Checksums and manifest, install, then publish unless ``publish`` is False (a version the quality
        gate refused is kept, not published), then prune to ``keep`` (None: no pruning). ``checksums``
        False keeps the manifest's own (benchmarks' multi-GB placeholder stores are not hashed)."""
        if self._finished is not None:
            raise VersionWriteError(f"internal: version {self.version} of {self.name!r} is finished already")
        if manifest.version != self.version:
            raise VersionWriteError(
                f"internal: the manifest names version {manifest.version}, the writer stages {self.version}"
            )
        if checksums:
            manifest.checksums = file_checksums(self.stage, self.linked_checksums)
        with names_full_disk(self.stage / MANIFEST_FILE):
            manifest.save(self.stage / MANIFEST_FILE)
        self._finished = install_and_publish(self.root, self.name, self.stage, self.version, publish, keep)
        return self._finished


def install_and_publish(
    root: Path, name: str, stage: Path, version: str, publish: bool, keep: int | None
) -> Finished:
    """Install a completely written stage (manifest included) with one rename, publish it unless
    ``publish`` is False (a failed publish removes the installed version again), then prune to ``keep``."""
    path = versions.install_version(root, name, stage, version)
    if publish:
        try:
            with names_full_disk(index_dir(root, name) / CURRENT_FILE):
                versions.publish_version(root, name, version)
        except BaseException:
            versions.discard_installed(root, name, version)
            raise
    finished = Finished(version, path, publish)
    if keep is not None:
        finished.pruned = versions.prune_versions(root, name, keep)
    return finished
