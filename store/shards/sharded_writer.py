"""Writing a sharded version (``store.version.sharding``): ``ShardedVersionWriter`` stages every shard as an
ordinary version folder inside one stage, then installs and publishes the whole version once:

    stage NAME/.builds/<version>/  ->  per shard: shard-NNN/ written (``ShardStage``: arrays, metadata,
    index, then ``seal``: checksums + its format-1 manifest) or hard-linked whole from the parent version
    (``link_shard``, an unchanged shard)  ->  the version's format-2 manifest with the ``sharding`` block
    (``sharding()`` reads the sealed shards)  ->  install (one rename)  ->  publish (CURRENT, once)  ->  prune

The only files of the version's own folder are its manifest and, for products, the product channels over
the global rows (``store.products.channels``, written into ``stage`` by
``store.products.channels.write_product_channels``):
the version's manifest records their checksums (``checksums``, empty for a version without them).

As with ``store.version.writer.VersionWriter``, leaving the writer without ``finish`` removes the stage, and
one
writer per index at a time is the caller's duty.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from store.errors import VersionWriteError
from store.files import names_full_disk
from store.layout import CURRENT_FILE, FORMAT_VERSION, MANIFEST_FILE, SHARDED_FORMAT_VERSION, file_checksums
from store.products.channels import has_product_channels
from store.shards.sharded import load_shard_manifest
from store.version.manifest import IndexManifest
from store.version.sharding import MAX_SHARDS, RULES, SHARD_RULE, ShardEntry, Sharding, shard_dir_name
from store.version.writer import (
    Finished,
    StagedFiles,
    StagedVersion,
    install_and_publish,
    link_version_files,
)


def _recorded_digest(shard_dir: Path) -> str | None:
    """The sha256 of shard ``shard_dir``'s manifest that the manifest of the sharded version holding it
    records (IndexFormatError when that cannot be read; VersionWriteError when it names no such shard).
    None where ``shard_dir`` is a whole unsharded version taken over as the first segment (a version's
    folder, beside CURRENT: nothing records its manifest's digest, and its files are checked against its
    own checksums as any version's are)."""
    holder = shard_dir.parent / MANIFEST_FILE
    if not holder.exists() and (shard_dir.parent / CURRENT_FILE).exists():
        return None
    version = IndexManifest.load(holder)
    if version.is_sharded:
        for entry in Sharding.from_dict(version.sharding).shards:
            if entry.dir == shard_dir.name:
                return entry.manifest_sha256
    raise VersionWriteError(f"internal: {shard_dir} is not a shard of the sharded version {shard_dir.parent}")


class ShardStage(StagedFiles):
    """One shard's folder inside a sharded version's stage: written like a version (``StagedFiles``),
    finished by ``seal``."""

    def __init__(self, stage: Path, index: int) -> None:
        self.stage = stage
        self.index = index

    def seal(self, manifest: IndexManifest) -> None:
        """The shard's checksums and its format-1 manifest (``version``: the sharded version's name)."""
        if manifest.is_sharded or manifest.format_version != FORMAT_VERSION:
            raise VersionWriteError(
                f"internal: shard {self.index}'s manifest must be format {FORMAT_VERSION}"
            )
        manifest.checksums = file_checksums(self.stage, self.linked_checksums)
        with names_full_disk(self.stage / MANIFEST_FILE):
            manifest.save(self.stage / MANIFEST_FILE)


class ShardedVersionWriter(StagedVersion):
    """Writes one new sharded version of index ``name`` under ``root`` with ``shard_count`` shards (see the
    module docstring). Use it as a context manager."""

    def __init__(
        self,
        root: Path,
        name: str,
        shard_count: int,
        *,
        version: str | None = None,
        rule: str = SHARD_RULE,
    ) -> None:
        if not 1 <= shard_count <= MAX_SHARDS:
            raise VersionWriteError(f"shard count must be within 1..{MAX_SHARDS}, got {shard_count}")
        self.shard_count = shard_count
        self.rule = rule
        self._own_known: dict[str, str] = {}  # own files linked from a parent, by their known checksums
        super().__init__(root, name, version=version)

    def _shard_dir(self, index: int) -> Path:
        if not 0 <= index < self.shard_count:
            raise VersionWriteError(f"internal: no shard {index} among {self.shard_count}")
        path = self.stage / shard_dir_name(index)
        if path.exists():
            raise VersionWriteError(f"internal: shard {index} of {self.version} is staged already")
        return path

    def shard(self, index: int) -> ShardStage:
        """A fresh folder for shard ``index``, to be written and sealed."""
        path = self._shard_dir(index)
        path.mkdir()
        return ShardStage(path, index)

    def link_shard(self, index: int, parent_shard_dir: Path) -> None:
        """Shard ``index`` taken over unchanged from a parent version: every file of its folder (manifest
        included) hard-linked (copied across filesystems). Its manifest must be the one the parent version's
        manifest records (``manifest_sha256``; a whole unsharded version taken over as the first segment
        has no such record, ``_recorded_digest``): a shard changed since the parent was published (rewritten
        and sealed afresh, its manifest replaced) raises VersionWriteError, else the new version would record
        the changed shard as good; the caller's build fails and nothing is published. A copy is checked as
        ``store.version.writer.link_version_files`` checks one, against the checksums the shard's manifest
        records:
        one that does not match (the parent's file rotted) raises VersionWriteError naming the file. Either
        way nothing of the shard is left staged."""
        path = self._shard_dir(index)
        folder = Path(parent_shard_dir)
        recorded = _recorded_digest(folder)
        layout = Sharding([ShardEntry(folder.name, 0, 0, "")])
        manifest, digest = load_shard_manifest(folder.parent, layout, 0)  # unreadable: IndexFormatError
        if recorded is not None and digest != recorded:
            raise VersionWriteError(
                f"{folder / MANIFEST_FILE}: sha256 {digest} is not the {recorded} the manifest of version "
                f"{folder.parent.name} records for it (the shard changed since that version was published); "
                "not taken over"
            )
        names = [p.name for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")]
        path.mkdir()
        try:
            link_version_files(
                folder,
                path,
                names,
                {**manifest.checksums, MANIFEST_FILE: digest},
                {},
                error=VersionWriteError,
            )
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # this call's folder: the shard may be staged afresh
            raise

    def link_own_files(self, parent_dir: Path, checksums: dict[str, str]) -> None:
        """The parent version's own files (its product channels, named by its manifest's ``checksums``)
        taken over unchanged: hard-linked (copied across filesystems), their checksums not read again."""
        link_version_files(
            parent_dir, self.stage, checksums, checksums, self._own_known, error=VersionWriteError
        )

    @property
    def linked_checksums(self) -> dict[str, str]:
        """{file: sha256} of the version's own files linked from a parent (``link_own_files``, or the
        product channels taken over whole, ``store.product_reuse.link_channels``), from its manifest."""
        return self._own_known

    def shard_manifest(self, index: int) -> IndexManifest:
        """The sealed (or linked) manifest of shard ``index``."""
        return load_shard_manifest(self.stage, self._layout(), index)[0]

    def _layout(self) -> Sharding:
        return Sharding([ShardEntry(shard_dir_name(i), 0, 0, "") for i in range(self.shard_count)])

    def sharding(
        self, merged_recall_at_10: float | None = None, merged_recall_measured_on: int = 0
    ) -> Sharding:
        """The ``sharding`` block of the staged shards (all sealed or linked), read from their manifests."""
        layout = self._layout()
        entries = []
        for i in range(self.shard_count):
            manifest, digest = load_shard_manifest(self.stage, layout, i)
            entries.append(
                ShardEntry(
                    dir=shard_dir_name(i),
                    count=manifest.count,
                    total_rows=manifest.total_rows,
                    manifest_sha256=digest,
                    index_factory=manifest.index_factory,
                    search_params=dict(manifest.search_params),
                    measured_recall_at_10=manifest.measured_recall_at_10,
                    recall_measured_on=manifest.recall_measured_on,
                )
            )
        return Sharding(
            entries,
            rule=self.rule,
            rule_text=RULES[self.rule],
            merged_recall_at_10=merged_recall_at_10,
            merged_recall_measured_on=merged_recall_measured_on,
        )

    def finish(self, manifest: IndexManifest, *, publish: bool = True, keep: int | None = None) -> Finished:
        """The version's manifest (format 2; its ``sharding`` block must describe the staged shards), install,
        publish unless ``publish`` is False, then prune to ``keep`` (None: no pruning)."""
        if self._finished is not None:
            raise VersionWriteError(f"internal: version {self.version} of {self.name!r} is finished already")
        if manifest.version != self.version:
            raise VersionWriteError(
                f"internal: the manifest names version {manifest.version}, the writer stages {self.version}"
            )
        if manifest.format_version != SHARDED_FORMAT_VERSION or not manifest.is_sharded:
            raise VersionWriteError(
                "internal: a sharded version's manifest is format 2 with a sharding block"
            )
        recorded = Sharding.from_dict(manifest.sharding)
        staged = self.sharding()
        key = [(s.dir, s.count, s.total_rows, s.manifest_sha256) for s in staged.shards]
        if [(s.dir, s.count, s.total_rows, s.manifest_sha256) for s in recorded.shards] != key:
            raise VersionWriteError(
                "internal: the manifest's sharding block does not describe the staged shards"
            )
        count, total = sum(s.count for s in staged.shards), sum(s.total_rows for s in staged.shards)
        if (manifest.count, manifest.total_rows) != (count, total):
            raise VersionWriteError(
                f"internal: the manifest says {manifest.count} items in {manifest.total_rows} rows, the "
                f"shards hold {count} in {total}"
            )
        own = file_checksums(self.stage, self._own_known)
        if own and not has_product_channels(self.stage):
            raise VersionWriteError(f"internal: files outside the shard folders: {sorted(own)}")
        manifest.checksums = own  # the product channels' files; {} without them
        with names_full_disk(self.stage / MANIFEST_FILE):
            manifest.save(self.stage / MANIFEST_FILE)
        self._finished = install_and_publish(self.root, self.name, self.stage, self.version, publish, keep)
        return self._finished
