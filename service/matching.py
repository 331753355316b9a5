"""Match quality of answers: every hit and every query labelled ``strong``, ``weak`` or ``none`` by the served
version's calibration (``indexer.match_calibration``), and ``min_score`` applied.

A version built before calibration existed gets one measured on it while the service loads it
(``Runtime._on_load``; its index and no-match queries only: a few hundred encoded queries, once per opened
version and process, kept for as long as that version is served).

``min_score``: ``auto`` (the default) labels and drops nothing: on the demo catalogue short in-domain
queries score inside the no-match range (README, "Match quality"), so dropping would lose right answers;
``weak`` drops hits labelled ``none``; ``strong`` keeps only strong hits; a number drops hits whose
cosine is below it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass

from indexer.match_calibration import MatchCalibration, MatchLabel, MatchThresholds, calibrate_version
from model.runtime import Encoder
from service.index_holder import Served
from service.schemas import MinScore, SearchHit
from store.opening import OpenedIndex

log = logging.getLogger(__name__)


@dataclass
class Judged:
    """Hits labelled (and filtered by ``min_score``), the query's label, the thresholds used."""

    hits: list[SearchHit]
    label: MatchLabel | None
    thresholds: MatchThresholds
    score: float | None = None  # what ``label`` reads: the top result's cosine


class MatchJudge:
    """Thread-safe; one per process."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        # Each opened version's calibration, for as long as it is open (dropped with it). Keyed by the opened
        # index, not the version name: one process serves many indexes (``Runtime``), and a name is unique
        # only within its index (a copied index folder repeats them). A cache of the last few names, shared
        # by every index, made more than a few served indexes evict each other and measure again at search
        # time (seconds per search of a version built before calibration was recorded).
        self._by_index: weakref.WeakKeyDictionary[OpenedIndex, MatchCalibration] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def calibration(self, served: Served) -> MatchCalibration:
        index = served.index
        found = self._by_index.get(index)
        if found is not None:
            return found
        with self._lock:  # one measurement per version, however many first queries arrive at once
            found = self._by_index.get(index)
            if found is None:
                found = self._recorded(served) or calibrate_version(index, self.encoder, {})
                self._by_index[index] = found
            return found

    @staticmethod
    def _recorded(served: Served) -> MatchCalibration | None:
        """The version's recorded calibration; None when it has none, or one that cannot be read (a
        hand-edited manifest: measured afresh as a version without one, never a failed load or search)."""
        recorded = served.index.manifest.match_calibration
        if not recorded:
            return None
        try:
            return MatchCalibration.from_dict(recorded)
        except ValueError as exc:  # all that ``from_dict`` raises on what is not a calibration
            log.warning(
                "version %s: unreadable match calibration (%s); measuring it afresh", served.version, exc
            )
            return None

    def judge(
        self,
        served: Served,
        lang: str | None,
        hits: list[SearchHit],
        top_score: float | None,
        min_score: MinScore,
    ) -> Judged:
        thresholds = self.calibration(served).thresholds(lang)
        for hit in hits:
            hit.match = thresholds.label(hit.score)
        label = None if top_score is None else thresholds.label(top_score)
        if min_score == "weak":
            hits = [h for h in hits if h.match != "none"]
        elif min_score == "strong":
            hits = [h for h in hits if h.match == "strong"]
        elif not isinstance(min_score, str):
            hits = [h for h in hits if h.score >= min_score]
        return Judged(hits, label, thresholds, top_score)
