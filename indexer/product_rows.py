"""Product channel rows by version row (``store.products.channels``: a channel's values grouped by their
owner, the
product's row): the mapping a sharded version needs, whose products' rows are global rows rather than
catalogue positions (``indexer.products``, ``indexer.sharded``).

``grouped_photos`` and ``grouped_by_row`` regroup photos and text values by owner (a product's values kept
in their order); ``grouped_by_row`` also gives the catalogue order, from which the fusion's pseudo-queries
are drawn as an unsharded build draws them. ``RowMove`` says where a sharded version's rows go when an
``add`` appends to its shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from store.products.channels import PhotoRows, TextRows


@dataclass
class RowMove:
    """Where the rows of a sharded version go when an ``add`` appends to its shards (``indexer.sharded``):
    ``parent`` the new row of each parent row, ``added`` each added item's row, ``products`` the rows."""

    parent: np.ndarray
    added: np.ndarray
    products: int


def grouped_photos(photos: PhotoRows) -> PhotoRows:
    """Photos grouped by product row (a product's photos in their order)."""
    order = np.argsort(photos.owners, kind="stable")
    return PhotoRows(
        owners=photos.owners[order],
        paths=[photos.paths[i] for i in order.tolist()],
        embeds=np.ascontiguousarray(photos.embeds[order]),
        visual=None if photos.visual is None else np.ascontiguousarray(photos.visual[order]),
        digests=None if photos.digests is None else photos.digests[order],
        stats=None if photos.stats is None else photos.stats[order],
    )


def grouped_by_row(texts: TextRows, rows: np.ndarray) -> tuple[TextRows, np.ndarray]:
    """Text values in the catalogue's order (owners: item positions) as a version over ``rows`` holds them:
    owners mapped to rows and grouped by them (a product's values in their order), and the catalogue order
    (the text row of each value in the catalogue's order)."""
    owners = np.asarray(rows, np.int64)[texts.owners] if texts.owners.size else texts.owners
    order = np.argsort(owners, kind="stable")
    catalogue_order = np.empty_like(order)
    catalogue_order[order] = np.arange(order.size)
    pick = order.tolist()
    grouped = TextRows(
        owners=owners[order],
        fields=[texts.fields[i] for i in pick],
        langs=[texts.langs[i] for i in pick],
        texts=[texts.texts[i] for i in pick],
        terms=[texts.terms[i] for i in pick],
        embeds=np.ascontiguousarray(texts.embeds[order]),
    )
    return grouped, catalogue_order.astype(np.int64)
