"""Synonym expansion of a text query (the format and its files: ``store.synonyms``).

A query is matched against the served synonyms on its words (``store.text.lexical.word_spans``: case-folded
and
stemmed as the query's language is analysed, so "Trainer" matches an entry's "trainers"); each match
yields *variants*, the query with that one term replaced by each of its synonyms, as written in the entry.
Expansion is one step: variants are not expanded again, and at most ``MAX_VARIANTS`` are made (leftmost,
longest matches first). What reads them:

- the lexical channel: each variant is one more reading of the query (``service.search.hybrid``), so its
  terms are searched by BM25 and a product holding a synonym counts as covering the query in the
  ``lexical`` feature (the best-covered reading counts, as for a query read in several languages);
- the dense channels (photos and text fields): the variants are encoded too and the query embedding is the
  normalised mean of the original's and the variants' (``expanded_query``; against the max over variants
  on the starter model, bench/synonyms.py).

Which set is served (``SynonymSource``): the version's own (``store.synonyms.SYNONYMS_FILE`` in its folder,
written at build time, immutable: read once per version) under the index-level one beside the versions
(the admin route's), which is looked at with one ``stat`` per search and read again when it changed, so an
edit takes effect at the next search, in every server process, without a restart.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.runtime import EncodedTexts
from store.layout import FileSignature, file_signature
from store.synonyms import (
    SYNONYMS_FILE,
    SynonymsError,
    SynonymSet,
    merged,
    read_document,
    term_key,
)
from store.text.lexical import word_spans

log = logging.getLogger(__name__)

MAX_VARIANTS = 8  # substituted queries per search: each is one more encoding (~1-3 ms of CPU) and reading
VERSIONS_KEPT = 16  # versions whose own sets stay parsed (a process serves a few indexes, one version each)

# A compiled table: the first word's key -> (the term's word keys, its synonyms as written, the term).
Table = dict[str, list[tuple[tuple[str, ...], tuple[str, ...], str]]]


@dataclass(frozen=True)
class Expansion:
    """A query's synonym variants and the substitutions that made them ("trainers -> sneakers")."""

    variants: tuple[str, ...]
    used: tuple[str, ...]


def applies(rule_lang: str | None, lang: str | None) -> bool:
    """Whether an entry of ``rule_lang`` applies to a query read as ``lang``: an entry without a language
    always; "pt" to "pt" and "pt-BR" queries; "pt-br" to "pt-BR" only. A query of no known language ("und")
    gets the entries without one."""
    if rule_lang is None:
        return True
    if lang is None:
        return False
    code = lang.lower().replace("_", "-")
    return rule_lang == code or rule_lang == code.split("-")[0]


class CompiledSynonyms:
    """A served set, matched per query language (each language's table built once). Thread-safe."""

    def __init__(self, synonyms: SynonymSet) -> None:
        self.synonyms = synonyms
        self.key = synonyms.digest  # result-cache keys
        self._tables: dict[str | None, Table] = {}
        self._lock = threading.Lock()

    def table(self, lang: str | None) -> Table:
        table = self._tables.get(lang)
        if table is not None:
            return table
        merged_targets: dict[tuple[str, ...], tuple[str, dict[str, str]]] = {}
        for rule in self.synonyms.rules:
            if not applies(rule.lang, lang):
                continue
            for source in rule.sources:
                keys = tuple(k for k, _, _ in word_spans(source, lang))
                if not keys:
                    continue
                _, targets = merged_targets.setdefault(keys, (source, {}))
                for target in rule.targets:
                    if term_key(target) != term_key(source):
                        targets.setdefault(term_key(target), target)
        table = {}
        for keys, (source, targets) in merged_targets.items():
            if targets:
                table.setdefault(keys[0], []).append((keys, tuple(targets.values()), source))
        for entries in table.values():
            entries.sort(key=lambda e: -len(e[0]))  # longest first: "tee shirt" before "tee"
        with self._lock:
            self._tables[lang] = table
        return table

    def expand(self, text: str, lang: str | None) -> Expansion | None:
        """The variants of query ``text`` read as ``lang`` (None: of no known language); None: no match."""
        table = self.table(lang)
        if not table:
            return None
        spans = word_spans(text, lang)
        keys = [k for k, _, _ in spans]
        variants: dict[str, str] = {}
        used: list[str] = []
        own = term_key(text)
        i = 0
        while i < len(keys) and len(variants) < MAX_VARIANTS:
            match = next((e for e in table.get(keys[i], ()) if tuple(keys[i : i + len(e[0])]) == e[0]), None)
            if match is None:
                i += 1
                continue
            seq, targets, _ = match
            start, end = spans[i][1], spans[i + len(seq) - 1][2]
            for target in targets:
                variant = f"{text[:start]}{target}{text[end:]}"
                if term_key(variant) != own and len(variants) < MAX_VARIANTS:
                    variants.setdefault(term_key(variant), variant)
                    used.append(f"{text[start:end]} -> {target}")
            i += len(seq)
        if not variants:
            return None
        return Expansion(tuple(variants.values()), tuple(used))


def combined_embedding(embeds: Sequence[np.ndarray]) -> np.ndarray:
    """The normalised mean of L2-normalised embeddings (the original query's first)."""
    total = np.sum(np.stack([np.asarray(e, np.float32).ravel() for e in embeds]), axis=0)
    norm = float(np.linalg.norm(total))
    return (total / norm if norm > 0 else total).astype(np.float32)


def expanded_query(query: EncodedTexts, variants: Sequence[EncodedTexts]) -> EncodedTexts:
    """The query as the dense channels search it: its embedding the mean of its own and its variants'
    (``combined_embedding``); its text states (what the fusion encoder re-ranks with) the original's."""
    embeds = [query.embeds[0], *(v.embeds[0] for v in variants)]
    return EncodedTexts(embeds=combined_embedding(embeds)[None, :], states=query.states, mask=query.mask)


class SynonymSource:
    """The served synonyms of each version (``of``). Thread-safe; one per process (the pipeline's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: OrderedDict[Path, SynonymSet | None] = OrderedDict()
        # Index-level file -> (its state when read, its set or None where it could not be used).
        self._indexes: dict[Path, tuple[FileSignature, SynonymSet | None]] = {}
        # (version folder, index-level file state) -> the compiled merge of the two.
        self._compiled: OrderedDict[tuple[Path, FileSignature], CompiledSynonyms | None] = OrderedDict()

    def of(self, version_dir: Path | None) -> CompiledSynonyms | None:
        """The synonyms a search of the version in ``version_dir`` expands with; None: none."""
        if version_dir is None:
            return None
        version_dir = Path(version_dir)
        index_file = version_dir.parent / SYNONYMS_FILE
        state = file_signature(index_file)  # the one stat a search pays
        key = (version_dir, state)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        own = self._version_set(version_dir)
        over = self._index_set(index_file, state)
        combined = merged(over, own) if (own or over) else None
        compiled = CompiledSynonyms(combined) if combined else None
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > VERSIONS_KEPT:
                self._compiled.popitem(last=False)
        return compiled

    def _version_set(self, version_dir: Path) -> SynonymSet | None:
        with self._lock:
            if version_dir in self._versions:
                return self._versions[version_dir]
        own = version_dir / SYNONYMS_FILE
        found = self._read(own) if file_signature(own) else None
        with self._lock:
            self._versions[version_dir] = found
            while len(self._versions) > VERSIONS_KEPT:
                self._versions.popitem(last=False)
        return found

    def _index_set(self, path: Path, state: FileSignature) -> SynonymSet | None:
        with self._lock:
            held = self._indexes.get(path)
        if held is not None and held[0] == state:
            return held[1]
        found = self._read(path) if state is not None else None
        with self._lock:
            self._indexes[path] = (state, found)
        return found

    @staticmethod
    def _read(path: Path) -> SynonymSet | None:
        """A stored set; None, with a warning, for one that cannot be used (hand-edited, damaged): searches
        go on without it rather than fail (``ccrk index build --synonyms`` and the admin route check what
        they write)."""
        try:
            return read_document(path)
        except SynonymsError as exc:
            log.warning("synonyms not used: %s", exc.message)
            return None
