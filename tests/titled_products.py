"""Small product indexes of given titles for the tests of query analysis (typos, compounds, spelling):
their channels written directly (``write_title_channels``) or built and served through the app
(``served_titles``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from indexer.build import build
from service.app import create_app
from store.products.channels import PhotoRows, ProductInfo, TextRows, write_product_channels
from store.text.lexical import analyze
from tests.fixtures import Catalogue, make_settings


def write_title_channels(root: Path, texts: Sequence[tuple[str, str]], vectors: np.ndarray) -> None:
    """Product channels of one product per (language, title), each with one photo and its title, both
    embedded as ``vectors`` (n, D)."""
    n = len(texts)
    owners = np.arange(n, dtype=np.int64)
    langs = sorted({lang for lang, _ in texts})
    info = ProductInfo(fields=["title"], text_languages=langs, language_counts={}, photos=0, texts=0)
    write_product_channels(
        root,
        info,
        PhotoRows(owners, [f"p{i}.jpg" for i in range(n)], vectors),
        TextRows(
            owners,
            ["title"] * n,
            [lang for lang, _ in texts],
            [t for _, t in texts],
            [analyze(t, lang) for lang, t in texts],
            vectors,
        ),
    )


@contextmanager
def served_titles(
    catalogue: Catalogue, root: Path, name: str, titles: Sequence[tuple[str, str]]
) -> Iterator[TestClient]:
    """The app serving a built index of one product per (language, title), its photo the catalogue's."""
    rows = [
        {"id": f"p{i}", "paths": [str(catalogue.records[i].image)], f"title@{lang}": title}
        for i, (lang, title) in enumerate(titles)
    ]
    manifest = root / "products.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    settings = make_settings(root / "indexes", index_name=name, text_fields=["title"], index_workers=1)
    report = build(name, [manifest], settings=settings)
    assert report.published
    with TestClient(create_app(settings.model_copy(update={"text_fields": []}))) as client:
        yield client


def search_text(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/search", json={"mode": "text", "top_k": 8, "explain": True, **body})
    assert response.status_code == 200, response.text
    return response.json()
