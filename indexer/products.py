"""The product channels of a build (``store.products.channels``): every photo of every product encoded, the
text
fields named by ``--text-fields`` (``Settings.text_fields``) embedded by the model's own text encoder and
analysed for lexical search, then the fusion calibrated on the staged version
(``indexer.fusion_calibration``).

A product's first photo is the version's own image of the item (encoded by the build as ever); its further
photos (``paths``) are encoded into a work folder of their own (resumable like the build's shards,
``indexer.product_photos``). A further photo that cannot be decoded is left out and counted in the report;
the product stays. A rebuild encodes only the photos and text values CURRENT's channels do not hold
(``indexer.product_reuse``): the others keep their stored vectors.

A sharded version (``indexer.sharded``) holds its product channels once, beside its shards, over its global
rows (``rows``: each item's row); they are encoded in the catalogue's order as for an unsharded version (the
same batches, so the same vectors), then grouped by row (``indexer.product_rows``), and the fusion is
calibrated on the pseudo-queries of the catalogue's order (``catalogue_order``), so that it is the one the
unsharded build calibrates.

Text values: a field ``title`` named in ``text_fields`` covers ``title`` and its language-tagged variants
(``title@de``, whose tag is taken as its language). Untagged values are identified by the service's detector
(``store.text.language_id``): first each field's language, from its values together (a shop mostly writes a
field in one language), then each value with that language as its prior. A value leaves its field's
language for another field's at ``OTHER_FIELDS_CONFIDENT`` when it does not mix languages (a retailer title
written in Swedish among English ones: "Mellanmjölk Ekologisk 1,5%"), for a language no field is in only at
``CONFIDENT`` and with 4 words or more; a short or unsure value keeps its field's language.

About 440 lines, kept in one module: the text values' reading (fields, languages, embeddings) and the
writing and calibrating of the channels they feed are the build's one product step, shared by a full build,
``ccrk index add`` (``extend_products``) and a sharded build; split, each would pass the same rows and info
between modules. Photos (``indexer.product_photos``), reuse (``indexer.product_reuse``) and row grouping
(``indexer.product_rows``) are already apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ccrk_settings import Settings
from indexer.channel_tuning import tune_channels
from indexer.fusion_calibration import CALIBRATION_CODE, calibrate
from indexer.product_photos import photo_rows
from indexer.product_reuse import (
    RECALIBRATE_SHARE,
    FirstPhotos,
    ProductReuse,
    fusion_usable,
    inputs_key,
    report_products,
    reused_texts,
    taken_over_calibration,
)
from indexer.product_rows import RowMove, grouped_by_row, grouped_photos
from indexer.report import BuildReport
from indexer.shards import ShardStore
from indexer.sources import SourceItem
from model.acquisition_format import acquirers_digest
from model.model_dir import ModelConfig
from model.runtime import Encoder
from store.errors import IndexFormatError
from store.product_reuse import link_channels, read_photo_digests, write_photo_stats, write_product_digests
from store.products.channels import (
    PRODUCTS_FILE,
    PhotoRows,
    ProductChannels,
    ProductInfo,
    TextRows,
    write_product_channels,
)
from store.products.hybrid import CANDIDATES
from store.text.language_id import FixedPrior, LanguageDetector
from store.text.lexical import STEMMERS, analyze

UNKNOWN = "und"
# Set by reasoning, not fitted to a catalogue: the field's prior is the service's prior for a catalogue
# language (service.language.SHARE_BONUS), and a value takes a language some field is in once the detector
# finds it the likelier one despite that prior.
FIELD_PRIOR = 1.5  # log-score of a value's field language
OTHER_FIELDS_CONFIDENT = 0.5  # confidence from which a value takes another field's language (not mixed)
CONFIDENT = 0.99  # confidence from which a value of 4+ words takes a language no field is in
FIELD_SAMPLE = 200  # values of a field identified together
FIELD_SAMPLE_CHARS = 20_000  # of those values' text
VALUE_CHARS = 1000  # of a value identified (a description's start tells its language)
SPACELESS = {"ja", "zh", "th", "ko"}
TEXT_BATCH = 64
MAX_TEXT_CHARS = 2000  # of one value, for the encoders (descriptions are embedded from their start)


@dataclass
class TextValue:
    owner: int
    field: str  # the base field name
    lang: str | None  # from the tag, else None until identified
    text: str


def wants_products(items: Sequence[SourceItem], settings: Settings) -> bool:
    """Whether a build writes product channels: some product has further photos, or text is searched."""
    return bool(settings.text_fields) or any(it.extra_paths for it in items)


def unheld_text_fields(items: Sequence[SourceItem], text_fields: Sequence[str]) -> list[str]:
    """The names of ``text_fields`` that no item holds (as such or language-tagged: ``title@de``); a build
    searching them would publish an image-only index without a word."""
    wanted = set(text_fields)
    held: set[str] = set()
    for item in items:
        held.update(key.partition("@")[0] for key in item.fields)
        if wanted <= held:
            return []
    return [name for name in dict.fromkeys(text_fields) if name not in held]


def text_values(items: Sequence[SourceItem], text_fields: Sequence[str]) -> list[TextValue]:
    """The searched text values of the items (rows in ``items``' order), grouped by row."""
    wanted = set(text_fields)
    values: list[TextValue] = []
    for row, item in enumerate(items):
        for key, value in item.fields.items():
            base, _, tag = key.partition("@")
            if base not in wanted or not isinstance(value, str) or not value.strip():
                continue
            values.append(TextValue(row, base, tag.lower() or None, " ".join(value.split())))
    return values


def catalogue_languages(languages: Sequence[str]) -> set[str]:
    """What a catalogue's values may be placed in: the languages with a stemmer, the model's
    (``languages``) and the scripts written without spaces."""
    return set(STEMMERS) | set(languages) | SPACELESS


def catalogue_detector(languages: Sequence[str]) -> LanguageDetector:
    """The detector ``identify_languages`` places values with, among ``catalogue_languages``. Built in
    about 0.5 s (its tables are read from disk): a caller placing values often (the live catalogue, product
    by product) keeps one."""
    return LanguageDetector(sorted(catalogue_languages(languages)))


def identify_languages(
    values: Sequence[TextValue], languages: Sequence[str], detector: LanguageDetector | None = None
) -> None:
    """Fill in the language of untagged values (module docstring): each field's language from its values
    together, then each value with its field's language as the prior. Among the languages with a stemmer,
    the model's (``languages``) and the scripts written without spaces, all alike; a value the detector
    cannot place among them (no letters, another language) keeps its field's language, and a field none of
    them stays unknown. ``detector``: ``catalogue_detector(languages)`` kept by the caller (else built)."""
    untagged = [v for v in values if v.lang is None]
    if not untagged:
        return
    candidates = catalogue_languages(languages)
    detector = detector or LanguageDetector(sorted(candidates))
    by_field: dict[str, list[TextValue]] = {}
    for value in untagged:
        by_field.setdefault(value.field, []).append(value)
    field_langs: dict[str, str | None] = {}
    for field, group in by_field.items():
        sample = " ".join(v.text for v in group[:FIELD_SAMPLE])[:FIELD_SAMPLE_CHARS]
        code, _ = detector.classify(sample)
        field_langs[field] = code if code in candidates else None
    used = {lang for lang in field_langs.values() if lang} | {v.lang for v in values if v.lang}
    seen: dict[tuple[str, str], str | None] = {}  # (field, text) -> language: catalogues repeat values
    for value in untagged:
        key = (value.field, value.text)
        if key not in seen:
            seen[key] = value_language(detector, value.text, field_langs[value.field], used, candidates)
        value.lang = seen[key]


def value_language(
    detector: LanguageDetector, text: str, field_lang: str | None, used: set[str], candidates: set[str]
) -> str | None:
    """A value's language: its field's, unless the detector, with the field's language as prior, finds
    another field's (at ``OTHER_FIELDS_CONFIDENT``, not mixed) or another language (at ``CONFIDENT``, 4+
    words)."""
    prior = FixedPrior({field_lang: FIELD_PRIOR}) if field_lang else None
    got = detector.detect(text[:VALUE_CHARS], prior)
    if got.code == field_lang or got.code not in candidates:
        return field_lang
    if got.code in used and got.confidence >= OTHER_FIELDS_CONFIDENT and not got.mixed:
        return got.code
    if got.confidence >= CONFIDENT and len(text.split()) >= 4:
        return got.code
    return field_lang


def encode_texts(encoder: Encoder, values: Sequence[TextValue]) -> np.ndarray:
    """(F, D) embeddings of the values by the model's text encoder (an acquired language's through its
    acquirer)."""
    dim = encoder.config.embed_dim
    out = np.zeros((len(values), dim), np.float32)
    acquired = set(encoder.acquired_languages)
    for lo in range(0, len(values), TEXT_BATCH):
        batch = values[lo : lo + TEXT_BATCH]
        texts = [v.text[:MAX_TEXT_CHARS] for v in batch]
        langs = [v.lang if v.lang in acquired else None for v in batch]
        encoded = encoder.encode_text(texts, langs if any(langs) else None)
        out[lo : lo + len(batch)] = encoded.embeds
    return out


def text_rows(
    items: Sequence[SourceItem], encoder: Encoder, settings: Settings, reuse: ProductReuse | None = None
) -> tuple[TextRows, ProductInfo]:
    """The searched text values of the items, identified, embedded (a value the parent's channels hold,
    ``reuse``, keeps its stored embedding) and analysed, and the channel info."""
    values = text_values(items, settings.text_fields)
    identify_languages(values, encoder.config.languages)
    for v in values:
        v.lang = v.lang or UNKNOWN
    # An acquired language's values are embedded by its acquirer, which the model's fingerprint (the reuse
    # key) does not cover: adding or retraining one leaves every stored text embedding behind.
    text_encoder = acquirers_digest(settings.model_dir) or ""
    same_encoder = (
        reuse is not None and reuse.stored is not None and reuse.stored.info.text_encoder == text_encoder
    )
    stored_rows = reused_texts(
        [(v.field, str(v.lang), v.text) for v in values],
        reuse if same_encoder else None,
        [items[v.owner].id for v in values],
    )
    embeds = np.zeros((len(values), encoder.config.embed_dim), np.float32)
    todo = np.flatnonzero(stored_rows < 0)
    if todo.size:
        embeds[todo] = encode_texts(encoder, [values[i] for i in todo.tolist()])
    found = np.flatnonzero(stored_rows >= 0)
    if found.size:
        assert reuse is not None and reuse.stored is not None
        embeds[found] = reuse.stored.text_vectors(stored_rows[found])
    if reuse is not None:
        reuse.texts_reused += int(found.size)
        reuse.texts_carried += int(np.unique(stored_rows[found]).size)
        reuse.texts_encoded += int(todo.size)
    counts = Counter(str(v.lang) for v in values)
    rows = TextRows(
        owners=np.asarray([v.owner for v in values], np.int64),
        fields=[v.field for v in values],
        langs=[str(v.lang) for v in values],
        texts=[v.text for v in values],
        terms=[analyze(v.text, v.lang) for v in values],
        embeds=embeds,
    )
    info = ProductInfo(
        fields=list(dict.fromkeys(settings.text_fields)),
        text_languages=sorted(counts),
        language_counts=dict(sorted(counts.items())),
        photos=0,
        texts=len(values),
        text_encoder=text_encoder,
    )
    return rows, info


def write_products(
    stage: Path,
    items: Sequence[SourceItem],
    main: ShardStore,
    encoder: Encoder,
    *,
    work_dir: Path,
    model_dir: Path,
    settings: Settings,
    cfg: ModelConfig,
    report: BuildReport,
    rows: np.ndarray | None = None,
    first: FirstPhotos | None = None,
    reuse: ProductReuse | None = None,
    linked: dict[str, str] | None = None,
) -> ProductInfo:
    """Write the product channels of a staged version and calibrate its fusion on them. ``rows``: each
    item's version row (a sharded version's global rows); default its position in ``items``. ``first``:
    which items' first photos this build encoded into ``main`` (default all) and their digests; ``reuse``:
    the parent's channels whose photos and text values are reused (``indexer.product_reuse``); ``linked``:
    the stage's writer's ``linked_checksums`` (channels taken over whole keep their recorded checksums)."""
    reuse = reuse or ProductReuse(None)
    try:
        photos = photo_rows(
            items, main, work_dir, model_dir, settings, cfg, report, rows, first=first, reuse=reuse
        )
        texts, info = text_rows(items, encoder, settings, reuse)
    finally:
        reuse.close()
    report_products(report, reuse)
    catalogue_order = None
    if rows is not None:
        texts, catalogue_order = grouped_by_row(texts, rows)
    return write_and_calibrate(
        stage,
        info,
        photos,
        texts,
        encoder,
        len(items),
        report,
        settings.target_recall,
        catalogue_order=catalogue_order,
        reuse=reuse,
        linked=linked,
    )


def extend_products(
    stage: Path,
    parent: ProductChannels,
    added: Sequence[SourceItem],
    main: ShardStore,
    encoder: Encoder,
    *,
    first_row: int,
    work_dir: Path,
    model_dir: Path,
    settings: Settings,
    cfg: ModelConfig,
    report: BuildReport,
    moved: RowMove | None = None,
) -> ProductInfo:
    """``ccrk index add`` on products: the parent's photos and text values as stored (nothing encoded
    again), then those of the ``added`` items (rows ``first_row`` on; their first photos from the add's
    shards ``main``), written into the staged version; the fusion is calibrated again on the whole, as a
    build would. The parent's searched fields stay the version's (``settings.text_fields`` is not read).
    ``moved``: a sharded version's rows (``first_row`` unused), the parent's moved and the added ones among
    them; the values are grouped by their new rows, the calibration's order the parent's, then the added."""
    old_photos, old_texts = parent.all_rows()
    # The parent's photo digests carried over (none: the version keeps none, and the next build reuses none).
    old_photos.digests, old_photos.stats = read_photo_digests(parent.path)
    if old_photos.digests is not None and old_photos.digests.shape[0] != old_photos.owners.size:
        old_photos.digests = old_photos.stats = None
    rows = first_row + np.arange(len(added), dtype=np.int64) if moved is None else moved.added
    photos = photo_rows(added, main, work_dir, model_dir, settings, cfg, report, rows)
    if (old_photos.visual is None) != (photos.visual is None):
        raise ValueError("internal: the added photos and the parent's differ in visual embeddings")
    fields = list(parent.info.fields)
    texts, _ = text_rows(added, encoder, settings.model_copy(update={"text_fields": fields}))
    texts.owners = rows[texts.owners] if texts.owners.size else texts.owners
    products = first_row + len(added)
    catalogue_order = None
    if moved is not None:
        products = moved.products
        old_photos.owners = moved.parent[old_photos.owners]
        old_texts.owners = moved.parent[old_texts.owners] if old_texts.owners.size else old_texts.owners
    all_photos, all_texts = old_photos.extended(photos), old_texts.extended(texts)
    if moved is not None:  # the added rows fall between the parent's: grouped by row again
        all_photos = grouped_photos(all_photos)
        all_texts, catalogue_order = grouped_by_row(all_texts, np.arange(products, dtype=np.int64))
    counts = Counter(all_texts.langs)
    info = ProductInfo(
        fields=fields,
        text_languages=sorted(counts),
        language_counts=dict(sorted(counts.items())),
        photos=0,
        texts=len(all_texts.texts),
    )
    return write_and_calibrate(
        stage,
        info,
        all_photos,
        all_texts,
        encoder,
        products,
        report,
        settings.target_recall,
        catalogue_order=catalogue_order,
    )


def write_and_calibrate(
    stage: Path,
    info: ProductInfo,
    photos: PhotoRows,
    texts: TextRows,
    encoder: Encoder,
    products: int,
    report: BuildReport,
    target_recall: float,
    *,
    catalogue_order: np.ndarray | None = None,
    reuse: ProductReuse | None = None,
    linked: dict[str, str] | None = None,
) -> ProductInfo:
    """Write the channels into the staged version, tune their graph walks for ``target_recall``
    (``indexer.channel_tuning``) and calibrate their fusion (when there is text) on the tuned walks
    (its pseudo-queries drawn in ``catalogue_order``, see ``indexer.fusion_calibration.calibrate``).
    When the parent's channels (``reuse``) were written from the very same inputs (``inputs_key``), they
    are taken over instead (hard links, their checksums the parent's into ``linked``, the writer's
    ``linked_checksums``): tuning and calibrating again would find what they hold."""
    info.inputs_key = inputs_key(info, photos, texts, products, target_recall, catalogue_order)
    parent = reuse.stored if reuse is not None else None
    if (
        parent is not None
        and parent.info.inputs_key == info.inputs_key
        and photos.digests is not None
        and fusion_usable(parent.info.fusion)
    ):
        assert reuse is not None
        try:
            link_channels(parent.path, stage, {} if linked is None else linked)
        except IndexFormatError as exc:  # a copy of a rotted file: written afresh, not recorded as good
            report.notes.append(f"products: channels of {reuse.parent_version} not taken over: {exc}")
        else:
            if photos.stats is not None:  # this build's: files touched since have new ones
                write_photo_stats(stage, photos.stats)
            report.notes.append(
                f"products: channels taken over from {reuse.parent_version} (the same photos, text values "
                "and vectors: writing, tuning and calibrating them again would find the same)"
            )
            return ProductInfo.load(stage / PRODUCTS_FILE)
    write_product_channels(stage, info, photos, texts)
    if photos.digests is not None:  # what the next build reuses (``store.product_reuse``)
        write_product_digests(stage, photos.digests, photos.embeds, photos.visual, texts.embeds, photos.stats)
    channels = ProductChannels(stage, products)
    taken = taken_over_calibration(reuse, info)
    try:
        info.search_params = tune_channels(channels, target_recall)
        result = (
            calibrate(
                channels, texts, encoder, info.language_counts, products, catalogue_order=catalogue_order
            )
            if texts.texts and taken is None
            else None
        )
    finally:
        channels.close()
    if taken is not None:
        info.fusion, info.calibration = taken.fusion, taken.calibration
        info.calibration_code = taken.calibration_code
        info.calibrated_in, info.changed_since_calibration = (
            taken.calibrated_in,
            taken.changed_since_calibration,
        )
        rows = f"{taken.changed_since_calibration:,} of {info.photos + info.texts:,} photo and text rows"
        kept = reuse is not None and reuse.keep_calibration
        report.notes.append(
            f"products: fusion calibration taken over from {taken.calibrated_in} ({rows} changed since it "
            + (
                "was calibrated: a compaction keeps the calibration its servers fused the changes with)"
                if kept
                else f"was calibrated, within {RECALIBRATE_SHARE:.0%}; --force calibrates again)"
            )
        )
    for name, tuned in info.search_params.items():
        report.notes.append(
            f"products: {name} walks at efSearch {tuned['efSearch']} (recall@{CANDIDATES} products "
            f"{tuned['recall']:.3f}, target {target_recall})"
        )
    if result is not None:
        info.fusion, info.calibration = result.model.to_dict(), result.report
        info.calibration_code = CALIBRATION_CODE
        languages = ", ".join(f"{k} {v}" for k, v in info.language_counts.items())
        cross = result.report.get("cross_validated", {})
        report.notes.append(
            f"hybrid search: {info.texts} text values ({languages}), {info.photos} photos; fusion "
            f"{result.model.method} calibrated on {result.report.get('pseudo_queries', 0)} pseudo-queries "
            f"(cross-validated R-precision by method: {cross})"
        )
    elif taken is None:
        report.notes.append(f"products: {info.photos} photos of {products} products (no text field searched)")
    if result is not None or taken is not None or info.search_params:
        (stage / PRODUCTS_FILE).write_text(info.to_json() + "\n", encoding="utf-8")
    return info
