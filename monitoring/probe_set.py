"""Probe sets: parallel queries ``{"id", "target_ids", "queries": {lang: text}}``, one JSON object a line.

The default set is drawn from a captioned catalogue (the synthetic catalogue's test split): one probe per
item, its first caption in every language, the item itself as the only target.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class ProbeSetError(ValueError):
    """A probe set file is malformed; the message names the file and the line."""


@dataclass(frozen=True)
class Probe:
    id: str
    target_ids: tuple[str, ...]
    queries: dict[str, str] = field(hash=False)

    def to_json(self) -> str:
        return json.dumps(
            {"id": self.id, "target_ids": list(self.target_ids), "queries": self.queries}, ensure_ascii=False
        )


def _fail(path: Path, lineno: int, message: str) -> ProbeSetError:
    return ProbeSetError(f"{path}:{lineno}: {message}")


def parse_probe(line: str, path: Path, lineno: int) -> Probe:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _fail(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    probe_id = obj.get("id")
    if not isinstance(probe_id, str) or not probe_id:
        raise _fail(path, lineno, f"field 'id' must be a non-empty string, got {probe_id!r}")
    targets = obj.get("target_ids")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise _fail(path, lineno, "field 'target_ids' must be a non-empty list of item ids")
    queries = obj.get("queries")
    if not isinstance(queries, dict) or len(queries) < 2:
        raise _fail(path, lineno, "field 'queries' must be an object of at least two languages: {lang: text}")
    for lang, text in queries.items():
        if not isinstance(text, str) or not text.strip():
            raise _fail(path, lineno, f"queries[{lang!r}] must be a non-empty string, got {text!r}")
    return Probe(probe_id, tuple(targets), dict(queries))


def load_probe_set(path: Path) -> list[Probe]:
    """Read a probe set; blank lines are skipped, duplicate ids and an empty file are errors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeSetError(f"{path}: cannot read the probe set: {exc}") from None
    probes: list[Probe] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        probe = parse_probe(line, path, lineno)
        if probe.id in seen:
            raise _fail(path, lineno, f"duplicate probe id {probe.id!r}")
        seen.add(probe.id)
        probes.append(probe)
    if not probes:
        raise ProbeSetError(f"{path}: the probe set holds no probe")
    return probes


def save_probe_set(probes: Iterable[Probe], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in probes), encoding="utf-8")


def probes_from_captions(
    items: Sequence[tuple[str, Mapping[str, Sequence[str]]]],
    *,
    n: int,
    seed: int = 0,
    languages: Sequence[str] | None = None,
) -> list[Probe]:
    """Up to ``n`` probes from (item id, captions by language): the item is the target, its first caption
    in each language the query. Items lacking one of ``languages`` (default: the languages every item
    has) are left out. Deterministic in ``seed``."""
    if languages is None:
        common: set[str] | None = None
        for _, captions in items:
            langs = {lang for lang, texts in captions.items() if texts}
            common = langs if common is None else common & langs
        languages = sorted(common or ())
    wanted = list(languages)
    eligible = [
        (item_id, captions) for item_id, captions in items if all(captions.get(lang) for lang in wanted)
    ]
    if len(wanted) < 2 or not eligible:
        return []
    order = np.random.default_rng(seed).permutation(len(eligible))[:n]
    return [
        Probe(
            id=f"probe-{eligible[i][0]}",
            target_ids=(eligible[i][0],),
            queries={lang: eligible[i][1][lang][0] for lang in wanted},
        )
        for i in sorted(int(i) for i in order)
    ]
