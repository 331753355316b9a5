"""Facet counts and per-value diversity over a search's relevant results.

A facet counts, for one metadata field, how many relevant results hold each value (a list field counts
each of its distinct items once per result), the numeric minimum and maximum, and the results per requested
range ``[from, to)``. "Relevant" is what the search's ``min_score`` cut keeps (with ``auto``: every result
not labelled none), over the whole ranked list, not the page, so the counts say what a shopper would find
by narrowing.

Facets are disjunctive, as shop front ends expect: a filter on a faceted field does not narrow that field's
own counts (ticking "brand: Oatly" still shows how many results the other brands have). So the counts of a
field the request filters on are taken over the relevant results of the same query without that filter:
``facet_counts`` asks the search for each such set through ``relevant``, once per filtered faceted field.

Values are read through ``Served.items`` (the row cache of the served version, or of its overlay), so the
counts are of exactly what the hits show.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from service.errors import InvalidInputError
from service.json_limits import JsonLimitError, parse_json
from service.schemas import (
    MAX_FACET_VALUE_CHARS,
    FacetRangeCount,
    FacetResult,
    Facets,
    FacetSpec,
    FacetValueCount,
    MaxPer,
    SearchHit,
)
from service.search.filters import SearchFilters, describe

# A counted value keyed so that JSON's true and 1 stay apart (Python's True == 1).
ValueKey = tuple[bool, Any]
# rows (a search's relevant results, ranked) under a set of filters (None: none)
RelevantRows = Callable[[SearchFilters | None], np.ndarray]
ItemsOf = Callable[[list[int]], list[dict[str, Any]]]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _countable(value: object) -> list[Any]:
    """The distinct scalar values a field's value contributes (a list: its scalar items)."""
    items = value if isinstance(value, list) else [value]
    seen: dict[ValueKey, Any] = {}
    for item in items:
        if isinstance(item, str | bool) or _is_number(item):
            seen.setdefault((isinstance(item, bool), item), item)
    return list(seen.values())


def count_field(spec: FacetSpec, items: Iterable[dict[str, Any]], relevant: int) -> FacetResult:
    """One field's facet over the relevant results' items; a 422 naming the field when a value is longer
    than a facet counts (a description rather than a category)."""
    counts: Counter[ValueKey] = Counter()
    low, high = math.inf, -math.inf
    missing = 0
    ranges = spec.ranges or []
    in_range = [0] * len(ranges)
    for item in items:
        values = _countable(item.get(spec.field))
        if not values:
            missing += 1
            continue
        numbers = [v for v in values if _is_number(v)]
        for value in values:
            if isinstance(value, str) and len(value) > MAX_FACET_VALUE_CHARS:
                raise InvalidInputError(
                    f"field {spec.field!r} holds values of {len(value):,} characters; facets count values of "
                    f"at most {MAX_FACET_VALUE_CHARS} (a category or a brand, not a description)",
                    loc=("body", "facets", spec.field),
                )
            counts[(isinstance(value, bool), value)] += 1
        if numbers:
            low, high = min(low, *numbers), max(high, *numbers)
            for n, (start, end) in enumerate(ranges):
                if any(
                    (start is None or v >= start) and (end is None or v < end) for v in numbers
                ):  # a list field counts once per range
                    in_range[n] += 1
    # Most first; ties by the value's text (numbers before text), so answers are stable.
    top = sorted(counts.items(), key=lambda kv: (-kv[1], isinstance(kv[0][1], str), str(kv[0][1])))
    return FacetResult(
        field=spec.field,
        values=[FacetValueCount(value=key[1], count=c) for key, c in top[: spec.size]],
        distinct=len(counts),
        missing=missing,
        min=None if low == math.inf else float(low),
        max=None if high == -math.inf else float(high),
        ranges=[
            FacetRangeCount(gte=start, lt=end, count=in_range[n]) for n, (start, end) in enumerate(ranges)
        ]
        if spec.ranges
        else None,
        relevant=relevant,
    )


def facet_counts(
    specs: Sequence[FacetSpec],
    filters: SearchFilters | None,
    relevant: RelevantRows,
    items_of: ItemsOf,
    rows: np.ndarray | None = None,
) -> list[FacetResult]:
    """The requested facets, in request order. ``rows``: the request's own relevant rows where the search
    already has them (else asked of ``relevant``); a field the request filters on is counted over
    ``relevant(filters without it)``."""
    plain = filters.plain if filters is not None else {}
    scopes: dict[str | None, np.ndarray] = {}
    if rows is not None:
        scopes[None] = rows
    results = []
    for spec in specs:
        scope = spec.field if spec.field in plain else None
        if scope not in scopes:
            rest = {k: v for k, v in plain.items() if k != scope}
            scopes[scope] = relevant(SearchFilters(rest) if rest else None)
        found = [int(r) for r in scopes[scope]]
        results.append(count_field(spec, items_of(found), len(found)))
    return results


def spread(
    ranked: Sequence[int], value_of: Callable[[int], Any], max_per: MaxPer, page: int, limit: int
) -> list[int]:
    """The first ``limit`` of ``ranked`` reordered so that each page of ``page`` results holds at most
    ``max_per.n`` with one value of the field (``value_of``: an entry's value; one without a value is never
    capped). Pages fill from the top; an entry over its value's cap moves to the first later page with room,
    in its order. Where too few other values are left to fill a page, it is filled with the best of the
    held entries, so every page but the last is full and offsets keep meaning positions."""
    waiting = list(ranked)
    out: list[int] = []
    while waiting and len(out) < limit:
        on_page: Counter[ValueKey] = Counter()
        taken: list[int] = []
        held: list[int] = []
        for entry in waiting:
            if len(taken) == page:
                held.append(entry)
                continue
            keys = [(isinstance(v, bool), v) for v in _countable(value_of(entry))]
            if any(on_page[k] >= max_per.n for k in keys):
                held.append(entry)
                continue
            on_page.update(keys)
            taken.append(entry)
        if len(taken) < page and held:  # too few other values: the page is filled, best first
            room = page - len(taken)
            chosen, held = held[:room], held[room:]
            on_this = {*taken, *chosen}
            taken = [e for e in waiting if e in on_this]  # in rank order
        out.extend(taken)
        waiting = held
    return out[:limit]


def spread_hits(hits: list[SearchHit], max_per: MaxPer, top_k: int, offset: int) -> list[SearchHit]:
    """The page ``[offset, offset + top_k)`` of ``hits`` (ranked from the first result) spread by
    ``max_per``, their ranks renumbered to their new places."""
    by_position = dict(enumerate(hits))
    order = spread(
        list(by_position),
        lambda n: by_position[n].metadata.get(max_per.field),
        max_per,
        top_k,
        offset + top_k,
    )
    page = [by_position[n] for n in order[offset : offset + top_k]]
    for n, hit in enumerate(page):
        hit.rank = offset + n
    return page


def check_fields(facets: Sequence[FacetSpec] | None, max_per: MaxPer | None, known: set[str]) -> None:
    """A 422 naming a faceted or ``max_per`` field the served version's items do not have (a typo would
    otherwise count every result as missing, or cap nothing, without a word)."""
    names = ", ".join(sorted(known)) or "none"
    for spec in facets or []:
        if spec.field not in known:
            raise InvalidInputError(
                f"unknown facet field {spec.field!r}; known fields: {names}",
                loc=("body", "facets", spec.field),
            )
    if max_per is not None and max_per.field not in known:
        raise InvalidInputError(
            f"unknown max_per field {max_per.field!r}; known fields: {names}",
            loc=("body", "max_per", "field"),
        )


_FACETS: TypeAdapter[list[FacetSpec] | None] = TypeAdapter(Facets)


def facets_from_form(text: str | None) -> list[FacetSpec] | None:
    """An image search's ``facets`` form field (JSON text), validated as the JSON body's are; a 422 naming
    ``facets`` otherwise."""
    if not text:
        return None
    try:
        return _FACETS.validate_python(parse_json(text))
    except JsonLimitError as exc:
        raise InvalidInputError(
            f"facets must be a JSON array of facets: {exc}", loc=("body", "facets")
        ) from None
    except ValidationError as exc:
        raise InvalidInputError(
            f"facets must be a JSON array of facets: {describe(exc)}", loc=("body", "facets")
        ) from None
