"""Checking one installed version: its files against the manifest's checksums, its counts and shapes
against each other (through the reader's public accessors), its stored fusion model (one the service
cannot parse it searches without), and its model against the one in use.

A sharded version is checked shard by shard (each shard's manifest against the sha256 the version's
manifest records, its files against its own checksums, its counts, every item in the shard the hash rule
names; of a segmented version, every live id in one segment only), then its totals against the version's
manifest."""

from __future__ import annotations

from pathlib import Path

from store.errors import IndexFormatError, ModelMismatchError
from store.layout import MANIFEST_FILE, METADATA_FILE, index_dir, sha256_file
from store.products.channels import PRODUCTS_FILE, ProductChannels, ProductInfo, has_product_channels
from store.products.hybrid import FusionModel
from store.shards.sharded import load_shard_manifest
from store.version.manifest import IndexManifest, check_model, model_fingerprint, model_name_of
from store.version.metadata import read_metadata
from store.version.reader import IndexVersion
from store.version.sharding import Sharding
from store.version.versions import current_version


def _checksum_problems(path: Path, manifest: IndexManifest, where: str = "") -> list[str]:
    """Files of one ordinary version folder (an unsharded version, or one shard) against its checksums."""
    problems: list[str] = []
    for fname, expected in manifest.checksums.items():
        fpath = path / fname
        if not fpath.is_file():
            problems.append(f"{where}{fname}: missing")
        elif sha256_file(fpath) != expected:
            problems.append(f"{where}{fname}: checksum mismatch")
    return problems


def _count_problems(path: Path, manifest: IndexManifest, where: str = "") -> list[str]:
    """Counts and shapes of one ordinary version folder, through the reader."""
    problems: list[str] = []
    try:
        with IndexVersion(path, manifest) as opened:
            if len(opened) != manifest.count:
                problems.append(f"{where}manifest count {manifest.count} but {len(opened)} live items")
            if opened.rerank_rows is not None and opened.rerank_rows != opened.total_rows:
                problems.append(
                    f"{where}re-rank store has {opened.rerank_rows} rows, index {opened.total_rows}"
                )
            if opened.metadata_rows != opened.total_rows:
                problems.append(f"{where}metadata has {opened.metadata_rows} rows, index {opened.total_rows}")
    except IndexFormatError as exc:
        problems.append(f"{where}{exc}")
    return problems


def _verify_shards(path: Path, manifest: IndexManifest) -> list[str]:
    try:
        sharding = Sharding.from_dict(manifest.sharding)
    except IndexFormatError as exc:
        return [str(exc)]
    problems: list[str] = []
    live_in: dict[str, int] = {}  # segments: the segment each live id was found in
    for i, entry in enumerate(sharding.shards):
        where = f"{entry.dir}/"
        try:
            shard, digest = load_shard_manifest(path, sharding, i)
        except IndexFormatError as exc:
            problems.append(str(exc))
            continue
        if digest != entry.manifest_sha256:
            problems.append(f"{where}{MANIFEST_FILE}: checksum mismatch")
            continue
        if (shard.count, shard.total_rows) != (entry.count, entry.total_rows):
            problems.append(
                f"{where}: {shard.count} items in {shard.total_rows} rows, the version's manifest says "
                f"{entry.count} in {entry.total_rows}"
            )
        if (shard.embed_dim, shard.model_fingerprint) != (manifest.embed_dim, manifest.model_fingerprint):
            problems.append(f"{where}: built with another model or embedding dim than the version's")
        found = _checksum_problems(path / entry.dir, shard, where)
        found = found or _count_problems(path / entry.dir, shard, where)
        problems += found
        if not found and sharding.segmented:
            twice = []
            for _, item_id, _, _, deleted in read_metadata(path / entry.dir / METADATA_FILE):
                if not deleted:
                    if item_id in live_in:
                        twice.append((item_id, live_in[item_id]))
                    live_in[item_id] = i
            if twice:
                problems.append(
                    f"{where}: {len(twice)} live id(s) live in an earlier segment too, e.g. {twice[0][0]!r} "
                    f"(also in {sharding.shards[twice[0][1]].dir})"
                )
        elif not found:
            strays = [
                item_id
                for _, item_id, _, _, deleted in read_metadata(path / entry.dir / METADATA_FILE)
                if not deleted and sharding.owner(item_id) != i
            ]
            if strays:
                problems.append(
                    f"{where}: {len(strays)} item(s) the hash rule puts elsewhere, e.g. {strays[0]!r}"
                )
    count = sum(s.count for s in sharding.shards)
    total = sum(s.total_rows for s in sharding.shards)
    if (count, total) != (manifest.count, manifest.total_rows):
        problems.append(
            f"the shards hold {count} items in {total} rows, the version's manifest says {manifest.count} in "
            f"{manifest.total_rows}"
        )
    return problems + _channel_problems(path, manifest, total)


def _channel_problems(path: Path, manifest: IndexManifest, total_rows: int) -> list[str]:
    """A sharded version's own files (its product channels) against its manifest's checksums, then opened
    over the version's global rows (their row counts and owners)."""
    problems = _checksum_problems(path, manifest)
    if has_product_channels(path) and not manifest.checksums:
        problems.append("product channel files beside the shards, but no checksums for them in the manifest")
    if problems or not has_product_channels(path):
        return problems
    try:
        ProductChannels(path, total_rows).close()
    except IndexFormatError as exc:
        problems.append(str(exc))
    return problems or _fusion_problems(path)


def _fusion_problems(path: Path) -> list[str]:
    """A version's stored fusion model (``products.json``), parsed as the service parses it: one that cannot
    be is not refused there (its products are fused by reciprocal rank, ``service.search.hybrid``), so
    the check names it."""
    if not has_product_channels(path):
        return []
    try:
        fusion = ProductInfo.load(path / PRODUCTS_FILE).fusion
    except IndexFormatError as exc:
        return [str(exc)]
    problem = FusionModel.stored(fusion).problem
    return [problem] if problem is not None else []


def verify_version(
    root: Path, name: str, version: str | None = None, *, model_dir: Path | None = None
) -> list[str]:
    """Problems found in one version (checksums, counts, shapes, model compatibility); [] when sound."""
    chosen = version or current_version(root, name)
    if chosen is None:
        return [f"index {name!r} has no published version"]
    path = index_dir(root, name) / chosen
    try:
        manifest = IndexManifest.load(path / MANIFEST_FILE)
    except IndexFormatError as exc:
        return [str(exc)]
    if manifest.is_sharded:
        problems = _verify_shards(path, manifest)
    else:
        problems = _checksum_problems(path, manifest)
        if problems:
            return problems
        problems = _count_problems(path, manifest) or _fusion_problems(path)
    if model_dir is not None:
        try:
            check_model(
                manifest,
                expect_fingerprint=model_fingerprint(model_dir),
                expect_model_name=model_name_of(model_dir),
            )
        except ModelMismatchError as exc:
            problems.append(str(exc))
    return problems


def model_to_verify(
    root: Path, name: str, version: str | None, model_dir: Path | None, default_model_dir: Path
) -> tuple[Path | None, str | None]:
    """The model ``verify_version`` checks a version against, and a note when it checks none. Given
    (``--model``): that one. Else the default model, if it is the one the manifest names (its folder name,
    or the same fingerprint); an index built with another model (``--model artifacts/models/ccrk-starter``)
    failed every verify against the default one, so the model it records is named instead, unchecked."""
    if model_dir is not None:
        return model_dir, None
    chosen = version or current_version(root, name)
    if chosen is None:
        return default_model_dir, None  # verify_version says there is no version
    try:
        manifest = IndexManifest.load(index_dir(root, name) / chosen / MANIFEST_FILE)
    except (IndexFormatError, OSError):
        return default_model_dir, None  # verify_version reports the manifest itself
    if manifest.model_name == model_name_of(default_model_dir):
        return default_model_dir, None
    try:
        if model_fingerprint(default_model_dir) == manifest.model_fingerprint:
            return default_model_dir, None
    except (IndexFormatError, OSError):
        pass  # no default model here: the note below says what the index needs
    return None, (
        f"model not checked: {name}/{chosen} was built with model {manifest.model_name!r} (fingerprint "
        f"{manifest.model_fingerprint[:12]}), not the default {default_model_dir}; pass --model DIR (the "
        f"{manifest.model_name} directory) to check it"
    )
