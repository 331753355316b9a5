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

Values are read through ``Served.values_of`` (the served version's row cache, which the hits read too), so
the counts are of exactly what the hits show.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from service.errors import InvalidInputError
from service.index_holder import Served
from service.schemas import (
    MAX_FACET_VALUE_CHARS,
    FacetRangeCount,
    FacetResult,
    Facets,
    FacetSpec,
    FacetValueCount,
    MaxPer,
    SearchHit,
    SortBy,
)
from service.search.facet_columns import FacetColumn, column_of
from service.search.filters import SearchFilters, form_json

# A counted value keyed so that JSON's true and 1 stay apart (Python's True == 1).
ValueKey = tuple[bool, Any]
# rows (a search's relevant results, ranked) under a set of filters (None: none)
RelevantRows = Callable[[SearchFilters | None], np.ndarray]
# (rows, fields) -> each field's value per row (None where absent): ``Served.values_of``
ValuesOf = Callable[[list[int], Sequence[str]], dict[str, list[Any]]]


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


def count_field(spec: FacetSpec, values: Sequence[Any], relevant: int) -> FacetResult:
    """One field's facet over the relevant results' values of it (one per result, None where absent), value
    by value: the path of a field that holds lists (a field of scalars is counted from its codes,
    ``count_codes``). Values are keyed so that JSON's true and 1 stay apart; a list counts each of its
    items once per result. A 422 naming the field when a text value is longer than a facet counts (a
    description, not a category)."""
    keyed: Counter[ValueKey] = Counter()
    numbers: list[float] = []
    listed: list[list[Any]] = []  # list values' countable items
    missing = 0
    for value in values:
        kind = type(value)
        if kind is list:
            items = _countable(value)
            if items:
                listed.append(items)
                keyed.update((isinstance(v, bool), v) for v in items)
            else:
                missing += 1
        elif kind is str or kind is bool or ((kind is int or kind is float) and math.isfinite(value)):
            keyed[(kind is bool, value)] += 1
            if kind is not str and kind is not bool:
                numbers.append(value)
        else:
            missing += 1
    longest = max((len(k[1]) for k in keyed if type(k[1]) is str), default=0)
    if longest > MAX_FACET_VALUE_CHARS:
        raise _too_long(spec, longest)
    numeric = _floats(numbers)
    every_number = np.concatenate([numeric, _floats([v for items in listed for v in items if _is_number(v)])])
    return FacetResult(
        field=spec.field,
        # Most first; ties in the order the ranking met them (Counter.most_common is stable).
        values=[FacetValueCount(value=key[1], count=n) for key, n in keyed.most_common(spec.size)],
        distinct=len(keyed),
        missing=missing,
        min=float(every_number.min()) if every_number.size else None,
        max=float(every_number.max()) if every_number.size else None,
        ranges=_range_counts(spec, numeric, listed) if spec.ranges else None,
        relevant=relevant,
    )


def _floats(numbers: list[float]) -> np.ndarray:
    """Numbers as floats; an integer no float holds (over ~1e308) is left out, as the columns leave it."""
    out = []
    for number in numbers:
        try:
            out.append(float(number))
        except OverflowError:
            continue
    return np.asarray(out, np.float64)


def _range_counts(spec: FacetSpec, scalars: np.ndarray, listed: list[list[Any]]) -> list[FacetRangeCount]:
    """Results per range ``[from, to)``: a number counts in its range; a list once in each range one of its
    numbers falls in."""
    assert spec.ranges is not None
    out = []
    for start, end in spec.ranges:
        inside = np.ones(scalars.size, bool)
        if start is not None:
            inside &= scalars >= start
        if end is not None:
            inside &= scalars < end
        count = int(inside.sum())
        count += sum(
            1
            for items in listed
            if any(
                _is_number(v) and (start is None or v >= start) and (end is None or v < end) for v in items
            )
        )
        out.append(FacetRangeCount(gte=start, lt=end, count=count))
    return out


def facet_counts(
    specs: Sequence[FacetSpec],
    filters: SearchFilters | None,
    relevant: RelevantRows,
    values_of: ValuesOf,
    rows: np.ndarray | None = None,
    columns: tuple[MutableMapping[str, FacetColumn], int] | None = None,
) -> list[FacetResult]:
    """The requested facets, in request order. ``rows``: the request's own relevant rows where the search
    already has them (else asked of ``relevant``); a field the request filters on is counted over
    ``relevant(filters without it)``. ``columns``: the served version's facet columns and its row count
    (``service.search.facet_columns``), where a field is counted from its codes."""
    plain = filters.plain if filters is not None else {}
    # Each field's scope: the request's filters, less its own where it filters on it (disjunctive).
    scope_of = {spec.field: spec.field if spec.field in plain else None for spec in specs}
    results: dict[str, FacetResult] = {}
    for scope in dict.fromkeys(scope_of.values()):
        if scope is None and rows is not None:
            found = np.asarray(rows, np.int64)
        else:
            rest = {k: v for k, v in plain.items() if k != scope}
            found = np.asarray(relevant(SearchFilters(rest) if rest else None), np.int64)
        by_value = []
        for spec in specs:
            if scope_of[spec.field] != scope:
                continue
            if columns is not None:
                column = column_of(columns[0], spec.field, columns[1])
                codes = column.codes_of(found, values_of)
                if codes is not None:
                    results[spec.field] = count_codes(spec, column, codes, found)
                    continue
            by_value.append(spec)
        if by_value:
            values = values_of(found.tolist(), [spec.field for spec in by_value])
            for spec in by_value:
                results[spec.field] = count_field(spec, values[spec.field], int(found.size))
    return [results[spec.field] for spec in specs]


def count_codes(spec: FacetSpec, column: FacetColumn, codes: np.ndarray, rows: np.ndarray) -> FacetResult:
    """One field's facet from its column's codes of the relevant results (``codes`` for ``rows``)."""
    valid = codes[codes >= 0]
    distinct, first, counts = np.unique(valid, return_index=True, return_counts=True)
    longest = column.longest(distinct)
    if longest > MAX_FACET_VALUE_CHARS:
        raise _too_long(spec, longest)
    top = np.lexsort((first, -counts))[: spec.size]  # most first; ties in the order the ranking met them
    numbers = column.numbers[rows]
    numbers = numbers[~np.isnan(numbers)]
    return FacetResult(
        field=spec.field,
        values=[FacetValueCount(value=column.values[distinct[i]], count=int(counts[i])) for i in top],
        distinct=int(distinct.size),
        missing=int(codes.size - valid.size),
        min=float(numbers.min()) if numbers.size else None,
        max=float(numbers.max()) if numbers.size else None,
        ranges=_range_counts(spec, numbers, []) if spec.ranges else None,
        relevant=int(rows.size),
    )


def _too_long(spec: FacetSpec, longest: int) -> InvalidInputError:
    return InvalidInputError(
        f"field {spec.field!r} holds values of {longest:,} characters; facets count values of at most "
        f"{MAX_FACET_VALUE_CHARS} (a category or a brand, not a description)",
        loc=("body", "facets", spec.field),
    )


def spread(
    ranked: Sequence[int], value_of: Callable[[int], Any], max_per: MaxPer, page: int, limit: int
) -> list[int]:
    """The first ``limit`` of ``ranked`` reordered so that each page of ``page`` results holds at most
    ``max_per.n`` with one value of the field (``value_of``: an entry's value; one without a value is never
    capped). Pages fill from the top; an entry over its value's cap moves to the first later page with room,
    in its order. Where too few other values are left to fill a page, it is filled with the best of the
    held entries, so every page but the last is full and offsets keep meaning positions."""
    # Each entry's value keys once (not once per page it waits on).
    keys = {e: [(isinstance(v, bool), v) for v in _countable(value_of(e))] for e in ranked}
    waiting = list(ranked)
    out: list[int] = []
    while waiting and len(out) < limit:
        on_page: Counter[ValueKey] = Counter()
        taken: list[int] = []
        held: list[int] = []
        for n, entry in enumerate(waiting):
            if len(taken) == page:
                held.extend(waiting[n:])
                break
            if any(on_page[k] >= max_per.n for k in keys[entry]):
                held.append(entry)
                continue
            on_page.update(keys[entry])
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


def check_fields(
    facets: Sequence[FacetSpec] | None,
    max_per: MaxPer | None,
    known: set[str],
    sort: SortBy | None = None,
) -> None:
    """A 422 naming a faceted, ``max_per`` or ``sort`` field the served version's items do not have (a typo
    would otherwise count every result as missing, cap nothing, or leave the results unsorted, without a
    word)."""
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
    if sort is not None and sort.field not in known:
        raise InvalidInputError(
            f"unknown sort field {sort.field!r}; known fields: {names}", loc=("body", "sort", "field")
        )


_FACETS: TypeAdapter[list[FacetSpec] | None] = TypeAdapter(Facets)


def facets_from_form(text: str | None) -> list[FacetSpec] | None:
    """An image search's ``facets`` form field (JSON text), validated as the JSON body's are; a 422 naming
    ``facets`` otherwise."""
    if not text:
        return None
    return form_json(text, _FACETS, "facets", "a JSON array of facets")


def columns_of(served: Served) -> tuple[MutableMapping[str, FacetColumn], int]:
    """A served version's facet columns and its row count (what ``facet_counts`` reads codes from)."""
    return served.facet_columns, int(served.index.total_rows)
