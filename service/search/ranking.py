"""Ranking a query against the served version: the dual encoder's ANN search by an embedding (text and
image queries alike), and the fusion encoder's re-ranking of a text query's shortlist: all ``rerank_k``
candidates (policy ``full``), or as many as the version's calibrated policy asks for that query
(``adaptive``, ``indexer.rerank_policy``; none when the dual answer is clear).

Nothing here records metrics: a ``Ranked`` page carries its stage timings, and the telemetry reads them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from indexer.rerank_policy import RerankPolicy
from model.reranking import MATCH_OUTPUT, RerankScore, rerank_scores
from model.runtime import EncodedTexts, Encoder, EncoderError
from service.cache import EMBEDDING, Cache, pack_texts, unpack_texts
from service.index_holder import Served
from service.search.query import digest

log = logging.getLogger(__name__)


@dataclass
class Ranked:
    """A result page before metadata: rows with their scores, and what it took to make it."""

    rows: np.ndarray
    scores: np.ndarray
    rerank_scores: np.ndarray | None  # NaN past the re-ranked head; None when not re-ranked
    first_rank: int
    top_score: float | None  # the best dual score among all candidates (the query's match quality)
    search_s: float
    rerank_s: float = 0.0
    rerank_candidates: int = 0  # shortlist scored by the fusion encoder; 0 when not re-ranked

    @property
    def reranked(self) -> bool:
        return self.rerank_scores is not None


@dataclass
class _Shortlist:
    """The ANN search's candidates in the dual encoder's order (rows that are no result removed)."""

    rows: np.ndarray
    scores: np.ndarray
    search_s: float

    @property
    def top_score(self) -> float | None:
        return float(self.scores.max()) if self.scores.size else None


RerankPolicyName = Literal["adaptive", "full"]


class Ranker:
    """Thread-safe (the encoder, the index and the cache are)."""

    def __init__(
        self,
        encoder: Encoder,
        cache: Cache,
        *,
        model_fingerprint: str,
        rerank_score: RerankScore,
        rerank_policy: RerankPolicyName = "full",
    ) -> None:
        self.encoder = encoder
        self.cache = cache
        self.model_fingerprint = model_fingerprint  # of what encodes queries: the model and its acquirers
        self.acquired = frozenset(encoder.acquired_languages)
        self.rerank_score = rerank_score
        self.rerank_policy = rerank_policy
        self._policies: dict[str, RerankPolicy | None] = {}  # per served version (a few kept)
        needed = MATCH_OUTPUT[rerank_score]
        if encoder.capabilities.rerank and needed not in encoder.capabilities.fusion_outputs:
            raise EncoderError(
                f"re-rank score {rerank_score!r} needs the fusion output {needed!r}, which this model's "
                "export lacks; re-run `ccrk export onnx` or keep the default score"
            )

    def encode_text(self, text: str, lang: str | None = None) -> EncodedTexts:
        """A normalised query's embedding (and text states for re-ranking), from the cache when there. A query
        in a language the model acquired (``lang``, detected or hinted) goes through that language's acquirer;
        any other through the model's own text tower."""
        route = lang if lang in self.acquired else None
        if not self.cache.enabled:
            return self._encode(text, route)
        key = f"{self.model_fingerprint[:16]}:{route or ''}:{digest(text)}"
        cached = self.cache.get(EMBEDDING, key)
        if cached is not None:
            try:
                return unpack_texts(cached)
            except (ValueError, OSError, EOFError):
                pass  # a foreign or truncated entry: encode again and overwrite it
        encoded = self._encode(text, route)
        self.cache.set(EMBEDDING, key, pack_texts(encoded))
        return encoded

    def _encode(self, text: str, route: str | None) -> EncodedTexts:
        if route is None:
            return self.encoder.encode_text([text]).row(0)
        return self.encoder.encode_text([text], languages=[route]).row(0)

    def by_embedding(
        self, served: Served, embeds: np.ndarray, *, top_k: int, offset: int, allowed: np.ndarray | None
    ) -> Ranked:
        """The dual encoder's order: an image query's ranking, and a text query's without re-ranking."""
        return self._page(self._shortlist(served, embeds, offset + top_k, allowed), top_k, offset)

    def text(
        self,
        served: Served,
        query: EncodedTexts,
        *,
        top_k: int,
        offset: int,
        rerank: bool,
        rerank_k: int,
        allowed: np.ndarray | None,
    ) -> Ranked:
        """A text query's page: the dual encoder's shortlist, its head re-ranked by the fusion encoder when
        ``rerank`` (ranks past ``rerank_k`` keep the dual order)."""
        if not rerank:
            return self.by_embedding(served, query.embeds, top_k=top_k, offset=offset, allowed=allowed)
        shortlist = self._shortlist(served, query.embeds, max(offset + top_k, rerank_k), allowed)
        rows, scores = shortlist.rows, shortlist.scores
        head = self.rerank_depth(served, scores, rerank_k)
        if not head:
            return self._page(shortlist, top_k, offset)  # nothing to re-rank, or the dual answer is clear
        start = time.perf_counter()
        combined = self.rerank_head(served, query, rows[:head], scores[:head])
        order = np.argsort(-combined, kind="stable")  # ties keep the dual encoder's order
        rows = np.concatenate([rows[:head][order], rows[head:]])
        scores = np.concatenate([scores[:head][order], scores[head:]])
        combined = np.concatenate([combined[order], np.full(rows.size - head, np.nan, np.float32)])
        page = slice(offset, offset + top_k)
        return Ranked(
            rows=rows[page],
            scores=scores[page],
            rerank_scores=combined[page],
            first_rank=offset,
            top_score=shortlist.top_score,
            search_s=shortlist.search_s,
            rerank_s=time.perf_counter() - start,
            rerank_candidates=head,
        )

    def rerank_depth(self, served: Served, scores: np.ndarray, rerank_k: int) -> int:
        """Candidates of a shortlist (its dual scores, descending) the fusion encoder scores: ``rerank_k``
        (at most the shortlist) with policy ``full`` or for a version without a calibrated policy, else
        the version's policy's choice (``indexer.rerank_policy``)."""
        full = min(rerank_k, int(scores.size))
        policy = self.policy(served) if self.rerank_policy == "adaptive" else None
        return full if policy is None else policy.depth(scores, full)

    def policy(self, served: Served) -> RerankPolicy | None:
        """The served version's calibrated policy; None when it has none, or one calibrated for another
        re-rank score than the one served (its gaps would not hold)."""
        version = served.version
        if version in self._policies:
            return self._policies[version]
        recorded = served.index.manifest.rerank.get("policy")
        try:
            policy = RerankPolicy.from_dict(recorded) if recorded else None
        except (KeyError, TypeError, ValueError) as exc:  # a hand-edited manifest: re-rank in full
            log.warning("version %s: unreadable re-rank policy (%s); re-ranking in full", version, exc)
            policy = None
        if policy is not None and policy.score != self.rerank_score:
            policy = None
        # Keep the versions a swap can still serve; older ones go (a race only parses twice).
        self._policies = {**dict(list(self._policies.items())[-3:]), version: policy}
        return policy

    def rerank_head(
        self, served: Served, query: EncodedTexts, rows: np.ndarray, scores: np.ndarray
    ) -> np.ndarray:
        """The re-rank scores of ``rows`` (their dual cosines ``scores``) by the fusion encoder over their
        stored tokens: by default the project's score, dual logit (similarity / temperature) + match
        log-odds."""
        tokens = served.index.rerank_tokens(rows)
        match = self.encoder.score_pairs(query, tokens, MATCH_OUTPUT[self.rerank_score]).astype(np.float32)
        combined = rerank_scores(scores, match, self.encoder.temperature, self.rerank_score)
        return combined.astype(np.float32)

    def _shortlist(
        self, served: Served, embeds: np.ndarray, n: int, allowed: np.ndarray | None
    ) -> _Shortlist:
        index = served.index
        n = max(1, min(n, len(index)))
        start = time.perf_counter()
        scores, rows = index.search(embeds, n, allowed)
        search_s = time.perf_counter() - start
        keep = rows[0] >= 0
        return _Shortlist(rows=rows[0][keep], scores=scores[0][keep], search_s=search_s)

    @staticmethod
    def _page(shortlist: _Shortlist, top_k: int, offset: int) -> Ranked:
        page = slice(offset, offset + top_k)
        return Ranked(
            rows=shortlist.rows[page],
            scores=shortlist.scores[page],
            rerank_scores=None,
            first_rank=offset,
            top_score=shortlist.top_score,
            search_s=shortlist.search_s,
        )
