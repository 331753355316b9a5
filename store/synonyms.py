"""Synonyms of an index, per language: the format, its checks and where it is kept.

A synonyms document (JSON, UTF-8)::

    {"synonyms": [
        {"terms": ["sneakers", "trainers"], "lang": "en"},      two-way: each term stands for the others
        {"from": "tee", "to": ["t-shirt", "tee shirt"]}         one-way: "tee" also searches the targets
    ]}

``lang`` (optional): the query language the entry applies to; without it, every language. A term is one
or more words (``MAX_TERM_WORDS``). Expansion is one step (``service.search.synonyms``): a substituted
term is not expanded again, so nothing here has to be transitive; one-way entries that form a cycle
(a -> b, b -> a, or longer, within a language) are refused all the same: a cycle says the author meant a
two-way group and wrote something else, and its meaning would change with the order rules apply in.

Two places hold a set (``SYNONYMS_FILE`` each):

- in a version, written at build time (``ccrk index build --synonyms FILE``), immutable and checksummed
  with the version's other files;
- beside the versions, ``INDEX_ROOT/NAME/synonyms.json``, edited through the admin route and kept across
  rebuilds. Served: the index-level set over the version's (per term and language, ``merged``).

Both are written atomically (``store.layout.write_atomic``): a reader sees the old set or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from store.layout import file_signature, fsync_dir, index_dir, write_atomic
from store.version.versions import current_version

SYNONYMS_FILE = "synonyms.json"
FORMAT = 1
MAX_ENTRIES = 1000  # entries of one set
MAX_TERMS = 16  # terms of a two-way group, targets of a one-way entry
MAX_TERM_CHARS = 64
MAX_TERM_WORDS = 8
MAX_FILE_BYTES = 1 << 20  # a set at its limits is ~1.1 MB of JSON at most with short terms; ~0.3 MB typical
LANG_RE = regex.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
_WORD = regex.compile(r"\w+", regex.UNICODE)


class SynonymsError(ValueError):
    """A synonyms document that breaks the format or a limit; ``loc`` names the entry (and field)."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ("synonyms",)) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


@dataclass(frozen=True)
class Rule:
    """One entry, normalised: ``sources`` each stand for every one of ``targets`` (a two-way group: every
    term is a source whose targets are the others)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    lang: str | None  # lower-cased, "_" read as "-"; None: every language
    two_way: bool

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = (
            {"terms": list(self.sources)}
            if self.two_way
            else {"from": self.sources[0], "to": list(self.targets)}
        )
        if self.lang is not None:
            body["lang"] = self.lang
        return body

    def pairs(self) -> list[tuple[str, str]]:
        """(source, target) of each substitution the entry allows."""
        return [(s, t) for s in self.sources for t in self.targets if s != t]


@dataclass(frozen=True)
class SynonymSet:
    rules: tuple[Rule, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "synonyms": [r.to_dict() for r in self.rules]}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n").encode("utf-8")

    @property
    def digest(self) -> str:
        """What identifies the set's meaning (result-cache keys): its normalised entries' hash."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.rules)


def term_key(term: str) -> str:
    """A term as entries are compared (duplicates, cycles): NFKC, case-folded, words joined by a space."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", term).casefold()))


def _term(value: Any, loc: tuple[str | int, ...]) -> str:
    if not isinstance(value, str):
        raise SynonymsError(f"a term must be a string, not {type(value).__name__}", loc)
    text = " ".join(value.split())
    if len(text) > MAX_TERM_CHARS:
        raise SynonymsError(f"a term is at most {MAX_TERM_CHARS} characters ({len(text)} given)", loc)
    words = term_key(text).split()
    if not words:
        raise SynonymsError(f"the term {text!r} holds no word (letters or digits)", loc)
    if len(words) > MAX_TERM_WORDS:
        raise SynonymsError(f"a term is at most {MAX_TERM_WORDS} words ({len(words)} given)", loc)
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
        raise SynonymsError("a term may not hold control characters or lone surrogates", loc)
    return text


def _terms(value: Any, loc: tuple[str | int, ...], least: int) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SynonymsError(f"must be a list of terms, not {type(value).__name__}", loc)
    if not least <= len(value) <= MAX_TERMS:
        raise SynonymsError(f"must hold {least} to {MAX_TERMS} terms ({len(value)} given)", loc)
    terms = tuple(_term(v, (*loc, i)) for i, v in enumerate(value))
    keys = [term_key(t) for t in terms]
    if len(set(keys)) != len(keys):
        raise SynonymsError("holds the same term twice (compared case-folded)", loc)
    return terms


def _rule(entry: Any, i: int) -> Rule:
    loc: tuple[str | int, ...] = ("synonyms", i)
    if not isinstance(entry, dict):
        raise SynonymsError(f"an entry must be an object, not {type(entry).__name__}", loc)
    lang = entry.get("lang")
    if lang is not None and (not isinstance(lang, str) or len(lang) > 32 or not LANG_RE.match(lang)):
        raise SynonymsError(f"lang {lang!r:.40} is not a language code (e.g. en, pt-BR)", (*loc, "lang"))
    lang = lang.lower().replace("_", "-") if lang is not None else None
    if "terms" in entry:
        extra = sorted(set(entry) - {"terms", "lang"})
        if extra:
            raise SynonymsError(f"a two-way entry holds terms and lang only, not {extra}", loc)
        terms = _terms(entry["terms"], (*loc, "terms"), 2)
        return Rule(terms, terms, lang, True)
    if "from" in entry or "to" in entry:
        extra = sorted(set(entry) - {"from", "to", "lang"})
        if extra:
            raise SynonymsError(f"a one-way entry holds from, to and lang only, not {extra}", loc)
        if "from" not in entry or "to" not in entry:
            raise SynonymsError("a one-way entry needs both from and to", loc)
        source = _term(entry["from"], (*loc, "from"))
        targets = _terms(entry["to"], (*loc, "to"), 1)
        if term_key(source) in {term_key(t) for t in targets}:
            raise SynonymsError(f"{source!r} maps to itself (a cycle of one entry)", (*loc, "to"))
        return Rule((source,), targets, lang, False)
    raise SynonymsError("an entry is {terms: [...]} (two-way) or {from: ..., to: [...]} (one-way)", loc)


def parse(data: Any) -> SynonymSet:
    """The set a document holds, checked (SynonymsError naming the entry for anything that breaks the
    format, a limit, or forms a cycle of one-way entries)."""
    if not isinstance(data, dict) or not isinstance(data.get("synonyms"), list):
        raise SynonymsError('a synonyms document is an object {"synonyms": [...]}', ())
    unknown = set(data) - {"synonyms", "format"}
    if unknown:
        raise SynonymsError(f"unknown fields {sorted(unknown)}", (sorted(unknown)[0],))
    if data.get("format", FORMAT) != FORMAT:
        raise SynonymsError(f"format {data.get('format')!r:.20} is not {FORMAT}", ("format",))
    entries = data["synonyms"]
    if len(entries) > MAX_ENTRIES:
        raise SynonymsError(f"at most {MAX_ENTRIES} entries ({len(entries)} given)")
    rules = tuple(_rule(entry, i) for i, entry in enumerate(entries))
    check_cycles(rules)
    return SynonymSet(rules)


def check_cycles(rules: tuple[Rule, ...]) -> None:
    """SynonymsError naming the entry that closes a cycle of one-way entries, within each language (an
    entry without ``lang`` takes part in every language's). Two-way groups are symmetric by design."""
    langs = {r.lang for r in rules}
    for lang in sorted(langs, key=lambda x: x or ""):
        edges: dict[str, list[tuple[str, int]]] = {}
        for i, rule in enumerate(rules):
            if not rule.two_way and rule.lang in (lang, None):
                for s, t in rule.pairs():
                    edges.setdefault(term_key(s), []).append((term_key(t), i))
        cycle = _find_cycle(edges)
        if cycle is not None:
            path, entries = cycle
            where = f" in language {lang}" if lang else ""
            raise SynonymsError(
                f"one-way entries {sorted(set(entries))} form a cycle{where}: "
                + " -> ".join(repr(p) for p in path)
                + "; write one two-way entry {terms: [...]} instead",
                ("synonyms", entries[-1]),
            )


def _find_cycle(edges: dict[str, list[tuple[str, int]]]) -> tuple[list[str], list[int]] | None:
    """A cycle of the graph (its terms, first repeated last, and the entries of its edges), or None.
    Iterative depth-first search (a set holds up to 16,000 edges: no recursion limit to meet)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if state.get(start):
            continue
        path, via = [start], []
        stack = [iter(edges.get(start, []))]
        state[start] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                state[path.pop()] = 2
                if via:
                    via.pop()
                continue
            node, entry = step
            if state.get(node) == 1:
                k = path.index(node)
                return [*path[k:], node], [*via[k:], entry]
            if not state.get(node):
                state[node] = 1
                path.append(node)
                via.append(entry)
                stack.append(iter(edges.get(node, [])))
    return None


def merged(over: SynonymSet | None, under: SynonymSet | None) -> SynonymSet:
    """``over``'s entries, then those of ``under`` whose sources ``over`` does not define for the same
    language: the index-level set over a version's (an entry of the version's is dropped when any of its
    sources is one the index-level set expands, so the index-level set decides that term)."""
    top = over.rules if over is not None else ()
    defined = {(r.lang, term_key(s)) for r in top for s in r.sources}
    rest = [
        r
        for r in (under.rules if under is not None else ())
        if not any((r.lang, term_key(s)) in defined for s in r.sources)
    ]
    return SynonymSet((*top, *rest))


def read_document(path: Path) -> SynonymSet:
    """The set a file holds (``ccrk index build --synonyms``, or one the store wrote): SynonymsError whose
    message names the file for anything unreadable or invalid."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SynonymsError(f"{path}: cannot read it: {exc.strerror or exc}", ()) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SynonymsError(f"{path}: larger than {MAX_FILE_BYTES} bytes", ())
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SynonymsError(f"{path}: not UTF-8 JSON: {exc}", ()) from None
    try:
        return parse(data)
    except SynonymsError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.loc)
        raise SynonymsError(f"{path}: {where.lstrip('.') or 'document'}: {exc.message}", exc.loc) from None


def write_version_synonyms(version_dir: Path, synonyms: SynonymSet) -> None:
    """A build's set into its staged version (before the manifest's checksums are taken)."""
    write_atomic(Path(version_dir) / SYNONYMS_FILE, synonyms.to_bytes())


def current_synonyms(root: Path, name: str) -> SynonymSet | None:
    """The set of the version CURRENT names (None: none, or no version): what ``add`` carries over into
    the version it writes (``delete`` links the parent's files, this one with them). One that cannot be
    used is not carried (searches ignore it)."""
    version = current_version(root, name)
    path = index_dir(root, name) / version / SYNONYMS_FILE if version else None
    if path is None or file_signature(path) is None:
        return None
    try:
        return read_document(path)
    except SynonymsError:
        return None


def index_synonyms_path(root: Path, name: str) -> Path:
    return index_dir(root, name) / SYNONYMS_FILE


def save_index_synonyms(root: Path, name: str, synonyms: SynonymSet) -> None:
    """The index-level set (admin route), replacing any earlier one atomically."""
    path = index_synonyms_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, synonyms.to_bytes())


def delete_index_synonyms(root: Path, name: str) -> bool:
    """Remove the index-level set; whether there was one."""
    path = index_synonyms_path(root, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):  # the unlink is done; a folder that cannot be synced keeps it
        fsync_dir(path.parent)
    return True
