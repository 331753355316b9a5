"""Merchandising rules at search time: which rules act on a query, and what they do to its products.

A rule acts on a search when the cosine of the search query's embedding and the rule query's (the serving
text encoder's, through ``Ranker.encode_text``; multilingual, so a rule written for "running shoes" acts on
"Laufschuhe") is at least the rule's threshold: one matrix product over the index's enabled rules. The
rules live beside the index's versions (``store.rules``); ``RuleBook`` re-reads them when the file changes
(one ``stat`` a search) and encodes each rule query once per (text, language), never per search.

What acting rules do to a products search (``service.search.hybrid.HybridRanker.text`` calls the hooks of
``ActingRules`` in this order):
- ``with_pins``: a pinned product that is live, allowed by the request's filters and not hidden joins the
  candidates when no channel found it (scored by its photos and text embeddings; no lexical match);
- ``drop_hidden``: ``hide`` drops the products its filter matches from the fused order, before re-ranking
  and the query's match label (which read only products that may be shown);
- ``reorder``: ``boost`` / ``bury`` add / subtract their weight on the fused score normalised to [0, 1]
  over the query's candidates (each place of the order keeps the normalised score of that place in the
  fused order, so a re-ranked order stays as it was where no rule acts); before the ``min_score`` cut,
  which still reads each product's own match quality;
- ``place``: after the cut and ``sort``, each pinned product is put at its 1-based position of the whole
  list (offset counted), the most similar rule first where two pin the same place or the same product;
- ``mark``: hits of pinned products say ``pinned``; ``explain`` names every rule that acted on a hit.

A filter naming a field the served version lacks (rebuilt without it) is skipped at search time, never an
error: the admin routes refuse such filters when a rule is written, against the version served then.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from service.index_holder import Served
from service.rule_schemas import BoostAction, BuryAction, HideAction, PinAction, Rule
from service.schemas import SearchHit
from service.search.filters import SearchFilters
from store.errors import IndexFormatError
from store.layout import FileSignature, file_signature
from store.products.channels import ProductChannels
from store.products.hybrid import Candidates
from store.rules import RulesFile, read_rules_file, rules_beside

log = logging.getLogger(__name__)

# (rule query, its language hint) -> its embedding, L2-normalised.
Embedder = Callable[[str, str | None], np.ndarray]


@dataclass(frozen=True)
class CompiledRule:
    id: str
    threshold: float
    pins: tuple[tuple[str, int], ...]  # (product id, 1-based position)
    weights: tuple[tuple[str, float], ...]  # (filter key, +weight for boost / -weight for bury)
    hides: tuple[str, ...]  # filter keys
    filters: dict[str, dict[str, Any]]  # filter key (its canonical JSON) -> the filter


def compile_rule(rule: Rule) -> CompiledRule:
    pins, weights, hides = [], [], []
    filters: dict[str, dict[str, Any]] = {}

    def key(plain: dict[str, Any]) -> str:
        text = json.dumps(plain, sort_keys=True)
        filters[text] = plain
        return text

    for action in rule.actions:
        if isinstance(action, PinAction):
            pins.append((action.pin, action.position))
        elif isinstance(action, BoostAction | BuryAction):
            flt = SearchFilters.of(action.boost if isinstance(action, BoostAction) else action.bury)
            assert flt is not None  # a rule's filter names at least one field (``RuleFilters``)
            weights.append(
                (key(flt.plain), action.weight if isinstance(action, BoostAction) else -action.weight)
            )
        elif isinstance(action, HideAction):
            flt = SearchFilters.of(action.hide)
            assert flt is not None
            hides.append(key(flt.plain))
    return CompiledRule(rule.id, rule.threshold, tuple(pins), tuple(weights), tuple(hides), filters)


@dataclass(frozen=True)
class LoadedRules:
    """One content of an index's rules file: its enabled rules, their embeddings and thresholds."""

    rules: tuple[CompiledRule, ...]
    embeds: np.ndarray  # (len(rules), D) float32, L2-normalised
    thresholds: np.ndarray  # (len(rules),) float32
    etag: str
    signature: FileSignature


NO_RULES = LoadedRules((), np.zeros((0, 0), np.float32), np.zeros(0, np.float32), "", None)


class RuleBook:
    """Thread-safe; one per process (``SearchPipeline.rules``)."""

    def __init__(self, embed: Embedder) -> None:
        self._embed = embed
        self._loaded: dict[Path, LoadedRules] = {}
        self._embeds: dict[tuple[str, str | None], np.ndarray] = {}
        self._lock = threading.Lock()
        # Each served version's rows of each filter (a published version is immutable): a rule's filter is
        # one SQLite scan per version, not one per search.
        self._masks: weakref.WeakKeyDictionary[Any, dict[str, np.ndarray | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._rows: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], int | None]] = (
            weakref.WeakKeyDictionary()
        )

    @staticmethod
    def path_of(served: Served) -> Path | None:
        where = getattr(served.index, "path", None)
        return rules_beside(where) if where is not None else None

    def loaded(self, served: Served) -> LoadedRules:
        """The rules of the served version's index as the file holds them now (re-read when it changed)."""
        path = self.path_of(served)
        if path is None:
            return NO_RULES
        now = file_signature(path)
        cached = self._loaded.get(path)
        if cached is not None and cached.signature == now:
            return cached
        with self._lock:
            cached = self._loaded.get(path)
            if cached is not None and cached.signature == file_signature(path):
                return cached
            try:
                fresh = self._load(read_rules_file(path))
            except IndexFormatError as exc:
                # A hand-edited file that is not a rules file: searched without rules (a warning per change).
                log.warning("%s; searching without merchandising rules", exc)
                fresh = replace(NO_RULES, etag=f"unreadable:{now}", signature=now)
            self._loaded[path] = fresh
            return fresh

    def refresh(self, served: Served, written: RulesFile) -> LoadedRules:
        """After a write through this process: the new rules encoded now, not at the next search."""
        path = self.path_of(served)
        fresh = self._load(written)
        if path is not None:
            with self._lock:
                self._loaded[path] = fresh
        return fresh

    def etag(self, served: Served) -> str:
        return self.loaded(served).etag

    def _load(self, file: RulesFile) -> LoadedRules:
        compiled, embeds = [], []
        for raw in file.rules:
            try:
                rule = Rule.model_validate(raw)
            except ValidationError as exc:  # a hand edit: that rule is left out, the others act
                log.warning("rule %r is not a valid rule, left out: %s", raw.get("id"), exc.errors()[:1])
                continue
            if not rule.enabled:
                continue
            compiled.append(compile_rule(rule))
            embeds.append(self.embedding(rule.query, rule.lang))
        if not compiled:
            return replace(NO_RULES, etag=file.etag, signature=file.signature)
        return LoadedRules(
            tuple(compiled),
            np.stack(embeds).astype(np.float32),
            np.asarray([r.threshold for r in compiled], np.float32),
            file.etag,
            file.signature,
        )

    def embedding(self, query: str, lang: str | None) -> np.ndarray:
        key = (query, lang)
        got = self._embeds.get(key)
        if got is None:
            vec = np.asarray(self._embed(query, lang), np.float32).ravel()
            got = vec / max(float(np.linalg.norm(vec)), 1e-12)
            if len(self._embeds) > 4096:  # rules of many indexes edited many times: start afresh
                self._embeds.clear()
            self._embeds[key] = got
        return got

    def similarities(self, loaded: LoadedRules, embed: np.ndarray) -> np.ndarray:
        q = np.asarray(embed, np.float32).ravel()
        return loaded.embeds @ (q / max(float(np.linalg.norm(q)), 1e-12))

    def match(self, served: Served, embed: np.ndarray) -> ActingRules | None:
        """The rules acting on a query of embedding ``embed``, most similar first; None when none acts."""
        loaded = self.loaded(served)
        if not loaded.rules or loaded.embeds.shape[1] != np.asarray(embed).size:
            return None
        sims = self.similarities(loaded, embed)
        acting = np.flatnonzero(sims >= loaded.thresholds)
        if not acting.size:
            return None
        acting = acting[np.argsort(-sims[acting], kind="stable")]
        return ActingRules(self, served, [loaded.rules[i] for i in acting.tolist()])

    def row_of(self, served: Served, item_id: str) -> int | None:
        """A pinned product's row in the served version (None: not in it), looked up once per version."""
        per_version = self._rows.setdefault(served.index, {})
        key = (live_sequence(served), item_id)  # a product deleted through the API is gone from then on
        known = per_version.get(key, -1)  # one read: another search may clear the dict at any time
        if known != -1:
            return known
        row = served.index.row_of(item_id)
        if len(per_version) >= 4096:
            per_version.clear()
        per_version[key] = row
        return row

    def mask(self, served: Served, key: str, plain: dict[str, Any]) -> np.ndarray | None:
        """The served version's live rows matching filter ``plain`` (``key``: its canonical JSON) as a
        boolean mask; None where the version lacks one of its fields (the action is skipped)."""
        per_version = self._masks.setdefault(served.index, {})
        key = f"{live_sequence(served)}:{key}"  # products' fields change through the API (``service.live``)
        if key in per_version:
            return per_version[key]
        fields = served.index.fields
        found: np.ndarray | None = None
        if all(name in fields for name in plain):
            found = np.zeros(served.index.total_rows, bool)
            found[np.asarray(served.index.filter_rows(plain), np.int64)] = True
        if len(per_version) >= 4096:
            per_version.clear()
        per_version[key] = found
        return found


def live_sequence(served: Served) -> int:
    """The last product write the served version shows (0: none; ``service.live``)."""
    return int(getattr(served.index, "live_sequence", 0))


@dataclass
class ActingRules:
    """The rules acting on one search, and what they did (for ``mark``)."""

    book: RuleBook
    served: Served
    rules: list[CompiledRule]
    acted: dict[int, list[str]] = field(default_factory=dict)  # product row -> ids of rules acting on it
    pins: list[tuple[int, int]] = field(default_factory=list)  # (product row, 1-based position)
    hidden: np.ndarray | None = None
    hide_masks: list[tuple[str, np.ndarray]] | None = None

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.rules]

    def _note(self, row: int, rule_id: str) -> None:
        names = self.acted.setdefault(row, [])
        if rule_id not in names:
            names.append(rule_id)

    def _hides(self) -> list[tuple[str, np.ndarray]]:
        """(rule id, mask) of every hide acting on this search."""
        if self.hide_masks is None:
            self.hide_masks = [
                (rule.id, m)
                for rule in self.rules
                for key in rule.hides
                if (m := self.book.mask(self.served, key, rule.filters[key])) is not None
            ]
            for _, m in self.hide_masks:
                self.hidden = m.copy() if self.hidden is None else self.hidden | m
        return self.hide_masks

    def _hidden(self) -> np.ndarray | None:
        self._hides()
        return self.hidden

    def with_pins(
        self,
        channels: ProductChannels,
        cands: Candidates,
        embed: np.ndarray,
        allowed: np.ndarray | None,
        *,
        use_image: bool,
        use_text: bool,
    ) -> Candidates:
        """``cands`` with each pinned product that may be shown (live, allowed by the request's filters, not
        hidden) and that no channel found. The pins are those of this ranking's ``allowed`` alone (one
        ``ActingRules`` serves one ranking; a second call starts afresh)."""
        hidden = self._hidden()
        self.pins = []
        seen: set[int] = set()
        for rule in self.rules:
            for item_id, position in rule.pins:
                row = self.book.row_of(self.served, item_id)
                if row is None or row in seen:  # not in this version, or pinned by a more similar rule
                    continue
                if (allowed is not None and not allowed[row]) or (hidden is not None and hidden[row]):
                    continue
                seen.add(row)
                self.pins.append((row, position))
                self._note(row, rule.id)
        if not self.pins:
            return cands
        missing = np.setdiff1d(np.asarray([r for r, _ in self.pins], np.int64), cands.rows)
        if not missing.size:
            return cands
        return _joined(channels, cands, missing, embed, use_image=use_image, use_text=use_text)

    def drop_hidden(self, cands: Candidates, order: np.ndarray) -> np.ndarray:
        """The order without the products a ``hide`` matches: no result, so neither re-ranked, nor read by
        the query's match label, nor kept by the cut (see the module docstring)."""
        hidden = self._hidden()
        return order if hidden is None else order[~hidden[cands.rows[order]]]

    def reorder(self, cands: Candidates, scores: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The order with boosts and buries applied (see the module docstring)."""
        if not order.size:
            return order
        adjust = np.zeros(len(cands), np.float64)
        moved = False
        for rule in self.rules:
            for key, weight in rule.weights:
                m = self.book.mask(self.served, key, rule.filters[key])
                if m is None:
                    continue
                hit = m[cands.rows[order]]
                if hit.any():
                    moved = True
                    adjust[order[hit]] += weight
                    for row in cands.rows[order[hit]].tolist():
                        self._note(int(row), rule.id)
        if not moved:
            return order
        by_place = np.sort(np.asarray(scores, np.float64)[order])[::-1]  # the fused score of each place
        span = float(by_place[0] - by_place[-1])
        key = (by_place - by_place[-1]) / span if span > 0 else np.ones_like(by_place)
        return order[np.argsort(-(key + adjust[order]), kind="stable")]

    def place(self, cands: Candidates, chosen: list[int]) -> list[int]:
        """``chosen`` (candidate indices after the cut and sort) with each pinned product at its position."""
        if not self.pins:
            return chosen
        where = {int(r): i for i, r in enumerate(cands.rows.tolist())}
        pinned = {where[row] for row, _ in self.pins if row in where}
        rest = [i for i in chosen if i not in pinned]
        placed: set[int] = set()
        for row, position in sorted(self.pins, key=lambda p: p[1]):  # stable: the more similar rule first
            i = where.get(row)
            if i is None:
                continue
            slot = min(position - 1, len(rest))
            while slot < len(rest) and rest[slot] in placed:
                slot += 1
            rest.insert(slot, i)
            placed.add(i)
        return rest

    def mark(self, hits: list[SearchHit], rows: list[int]) -> None:
        """Pinned hits say so; explanations name the rules that acted on each hit."""
        pinned = {row for row, _ in self.pins}
        for hit, row in zip(hits, rows, strict=True):
            hit.pinned = row in pinned
            if hit.explain is not None:
                hit.explain.rules = list(self.acted.get(row, []))


def _joined(
    channels: ProductChannels,
    cands: Candidates,
    rows: np.ndarray,
    embed: np.ndarray,
    *,
    use_image: bool,
    use_text: bool,
) -> Candidates:
    """``cands`` and products ``rows`` that no channel found, scored as ``store.products.hybrid.gather``
    scores a
    candidate (exact best photo and text cosines, the text centroid), in no channel's list (rank -1) and
    without a lexical match (no term coverage either: what it covers is not asked, as a pinned product's
    place is the rule's): a filtered walk for one product would escalate to the whole index."""
    q = np.ascontiguousarray(embed, np.float32).ravel()
    n = rows.size
    features = np.zeros((n, cands.features.shape[1]), np.float32)
    photo = np.full(n, -1, np.int64)
    text = np.full(n, -1, np.int64)
    if use_image:
        features[:, 0], photo = channels.photos.best_of(q, rows)
    if use_text:
        features[:, 1], text, features[:, 4] = channels.texts.best_and_centroid_of(
            q, rows, None, channels.text_sum_norms
        )
    features[~np.isfinite(features)] = -1.0
    presence = cands.term_presence
    if presence is not None:
        presence = np.concatenate([presence, np.zeros((n, presence.shape[1]), bool)])
    return replace(
        cands,
        rows=np.concatenate([cands.rows, rows]),
        features=np.concatenate([cands.features, features]),
        ranks=np.concatenate([cands.ranks, np.full((n, cands.ranks.shape[1]), -1, np.int64)]),
        photo=np.concatenate([cands.photo, photo]),
        text=np.concatenate([cands.text, text]),
        lexical=np.concatenate([cands.lexical, np.full(n, -1, np.int64)]),
        term_presence=presence,
    )
