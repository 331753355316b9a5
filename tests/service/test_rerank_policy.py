"""``CCRK_RERANK_POLICY`` end to end: ``full`` re-ranks every query's ``rerank_k`` candidates as before;
``adaptive`` re-ranks as many as the version's recorded policy asks (``indexer.rerank_policy``), the dual
order kept where it asks none, and never returns fewer results. Exact references: the policy's decision
written out on brute-force dual scores, and the fusion scores as ``model.reranking`` defines them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from indexer.rerank_policy import RerankPolicy
from model.runtime import Encoder
from tests.fixtures import Catalogue, LiveServer, make_settings, write_version

QUERIES = [(row, lang) for row in (0, 7, 19, 33, 48, 55) for lang in ("en", "fr", "ja")]


def caption(catalogue: Catalogue, row: int, lang: str) -> str:
    return catalogue.records[row].captions[lang][1]


def dual(catalogue: Catalogue, encoder: Encoder, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Every item in the dual order: (rows, cosines), ties by row."""
    scores = catalogue.encoded.embeds @ encoder.encode_text([text]).embeds[0]
    rows = np.array(sorted(range(scores.size), key=lambda i: (-scores[i], i)))
    return rows, scores[rows]


def reference(
    catalogue: Catalogue, encoder: Encoder, text: str, depth: int, top_k: int
) -> tuple[list[str], bool]:
    """The ids of a page whose first ``depth`` dual candidates are re-ranked (similarity / temperature +
    match margin on the stored fp16 tokens); the rest keep the dual order."""
    rows, scores = dual(catalogue, encoder, text)
    if depth:
        query = encoder.encode_text([text]).row(0)
        tokens = catalogue.encoded.tokens[rows[:depth]].astype(np.float16).astype(np.float32)
        combined = scores[:depth] / encoder.temperature + encoder.score_pairs(query, tokens)
        rows = np.concatenate([rows[:depth][np.argsort(-combined, kind="stable")], rows[depth:]])
    return [catalogue.records[r].id for r in rows[:top_k]], depth > 0


@pytest.fixture(scope="module")
def policy(catalogue: Catalogue, encoder: Encoder) -> RerankPolicy:
    """A policy whose depth-0 gap is the median of the test queries' own gaps: both decisions happen."""
    gaps = [float(np.subtract(*dual(catalogue, encoder, caption(catalogue, *q))[1][:2])) for q in QUERIES]
    return RerankPolicy((0, 16, 32), (float(np.median(gaps)), 0.0, None))


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, catalogue: Catalogue, policy: RerankPolicy
) -> Iterator[dict[str, LiveServer]]:
    root = tmp_path_factory.mktemp("policy-index")
    write_version(root, catalogue, rerank_policy=policy.to_dict())
    with (
        LiveServer(make_settings(root, rerank=True, rerank_policy="full")) as full,
        LiveServer(make_settings(root, rerank=True, rerank_policy="adaptive")) as adaptive,
    ):
        yield {"full": full, "adaptive": adaptive}


def search(server: LiveServer, text: str, **body: object) -> dict:
    with server.client() as client:
        response = client.post("/v1/search", json={"query": text, "rerank": True, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_full_policy_re_ranks_every_candidate_as_before(
    servers: dict[str, LiveServer], catalogue: Catalogue, encoder: Encoder
) -> None:
    for row, lang in QUERIES:
        text = caption(catalogue, row, lang)
        body = search(servers["full"], text, top_k=20)
        ids, _ = reference(catalogue, encoder, text, depth=len(catalogue.records), top_k=20)
        assert [h["id"] for h in body["results"]] == ids and body["reranked"] is True
        assert all(h["rerank_score"] is not None for h in body["results"])


def test_adaptive_policy_re_ranks_as_its_decision_says_and_never_returns_fewer(
    servers: dict[str, LiveServer], catalogue: Catalogue, encoder: Encoder, policy: RerankPolicy
) -> None:
    depths = []
    for row, lang in QUERIES:
        text = caption(catalogue, row, lang)
        depth = policy.depth(dual(catalogue, encoder, text)[1], 128)
        depths.append(depth)
        body = search(servers["adaptive"], text, top_k=20)
        ids, reranked = reference(catalogue, encoder, text, depth=depth, top_k=20)
        assert [h["id"] for h in body["results"]] == ids, (text, depth)
        assert body["reranked"] is reranked and len(body["results"]) == 20
        assert [h["rerank_score"] is not None for h in body["results"]] == [n < depth for n in range(20)]
        # A later page of the same query: the same order, as many results.
        page = search(servers["adaptive"], text, top_k=10, offset=15)
        assert [h["id"] for h in page["results"]] == reference(catalogue, encoder, text, depth, 25)[0][15:]
    assert sorted(set(depths)) == [0, 16]  # both decisions were exercised
    # The server's own count of candidates scored: only the re-ranked queries, 16 each.
    histogram = servers["adaptive"].app.state.runtime.metrics.rerank_candidates
    assert sum(s.value for s in histogram.collect()[0].samples if s.name.endswith("_sum")) == 16 * 2 * sum(
        d == 16 for d in depths
    )
