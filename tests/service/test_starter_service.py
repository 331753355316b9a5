"""The service on the starter model (no fusion encoder): it says so, searches by text and by image, and
refuses re-ranking with a 422 naming the field instead of silently not re-ranking."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ccrk_settings import Settings
from indexer.build import build
from tests.fixtures import LiveServer, make_settings
from tests.indexer.files import write_photo


@pytest.fixture(scope="module")
def starter_server(tmp_path_factory: pytest.TempPathFactory, starter_model: Path) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("photos")
    for i in range(6):
        write_photo(folder / f"p{i}.jpg", i, (320, 240))
    root = tmp_path_factory.mktemp("indexes")
    build(
        "shop",
        [folder],
        settings=Settings(model_dir=starter_model, index_root=root, threads=1, index_workers=0),
    )
    # The server default asks for re-ranking; the model cannot, so its default is off.
    with LiveServer(make_settings(root, model_dir=starter_model, rerank=True)) as live:
        yield live


@pytest.fixture()
def client(starter_server: LiveServer) -> Iterator[httpx.Client]:
    with starter_server.client() as c:
        yield c


def test_model_route_states_no_rerank(client: httpx.Client) -> None:
    info = client.get("/v1/model").json()
    assert info["architecture"] == "conse" and info["rerank"] is False and info["rerank_default"] is False
    assert info["embed_dim"] == 512 and {"en", "de", "ja", "zh", "ko", "ar"} <= set(info["languages"])
    assert client.get("/v1/index").json()["rerank"]["tokens"] == 0


def test_search_without_rerank_and_refusal_with_it(client: httpx.Client) -> None:
    for body in ({"query": "ein Hund"}, {"query": "ein Hund", "rerank": False}):
        answer = client.post("/v1/search", json=body)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["reranked"] is False and len(data["results"]) == 6
        assert all(hit["rerank_score"] is None for hit in data["results"])
    refused = client.post("/v1/search", json={"query": "ein Hund", "rerank": True})
    assert refused.status_code == 422
    (detail,) = refused.json()["detail"]
    assert detail["loc"] == ["body", "rerank"] and "no fusion encoder" in detail["msg"]
    refused = client.post(
        "/v1/consistency", json={"queries": {"en": "a dog", "de": "ein Hund"}, "top_k": 3, "rerank": True}
    )
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "rerank"]
    report = client.post("/v1/consistency", json={"queries": {"en": "a dog", "de": "ein Hund"}, "top_k": 3})
    assert report.status_code == 200 and len(report.json()["languages"]) == 2


def test_image_search_and_page(client: httpx.Client) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (300, 200), (10, 120, 200)).save(buffer, format="PNG")
    answer = client.post("/v1/search/image", files={"file": ("q.png", buffer.getvalue(), "image/png")})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"]) > 0
    page = client.get("/").text
    assert 'id="rerank" type="checkbox" disabled' in page and "not available for this model" in page
