"""Synonyms of a served index (``store.synonyms``): the index-level set, read, replaced and removed by an
admin (the admin key or an API key of scope admin allowed the index). Searches read a change at their next
query (``service.search.synonyms``), in every server process, without a reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter

from service.api.deps import AdministeredIndexDep
from service.errors import IndexUnavailableError, InvalidInputError
from service.index_holder import IndexHolder
from service.synonym_schemas import OneWaySynonyms, SynonymsDocument, SynonymsResponse, TwoWaySynonyms
from store.layout import file_signature
from store.synonyms import (
    SYNONYMS_FILE,
    SynonymsError,
    SynonymSet,
    delete_index_synonyms,
    index_synonyms_path,
    parse,
    read_document,
    save_index_synonyms,
)

router = APIRouter(prefix="/v1/admin/indexes", tags=["admin"])

RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong API key."},
    403: {"description": "An API key of scope search, or one not allowed this index."},
    404: {"description": "Admin disabled, or the index is not served."},
    503: {"description": "The index-level set could not be written or removed (the old one stays)."},
}


def _entries(synonyms: SynonymSet | None) -> list[TwoWaySynonyms | OneWaySynonyms]:
    out: list[TwoWaySynonyms | OneWaySynonyms] = []
    for rule in synonyms.rules if synonyms is not None else ():
        body = rule.to_dict()
        out.append(TwoWaySynonyms(**body) if rule.two_way else OneWaySynonyms.model_validate(body))
    return out


def _state(holder: IndexHolder) -> SynonymsResponse:
    """What the route answers: the index-level set and the served version's (blocking: file reads)."""
    served = holder.served
    version_dir = getattr(served.index, "path", None) if served is not None else None
    problems: list[str] = []

    def read(path: Path) -> SynonymSet | None:
        if file_signature(path) is None:
            return None
        try:
            return read_document(path)
        except SynonymsError as exc:
            problems.append(exc.message)
            return None

    path = index_synonyms_path(holder.root, holder.name)
    own = read(Path(version_dir) / SYNONYMS_FILE) if version_dir is not None else None
    return SynonymsResponse(
        index=holder.name,
        synonyms=_entries(read(path)),
        stored=file_signature(path) is not None,
        version=served.version if served is not None else None,
        version_synonyms=_entries(own),
        problem="; ".join(problems) or None,
    )


def _save(holder: IndexHolder, synonyms: SynonymSet | None) -> SynonymsResponse:
    """Replace (``synonyms``) or remove (None) the index-level set, then the route's answer; a 503 where the
    file system refuses (the old set stays: the write is an atomic replace)."""
    try:
        if synonyms is None:
            delete_index_synonyms(holder.root, holder.name)
        else:
            save_index_synonyms(holder.root, holder.name, synonyms)
    except OSError as exc:
        raise IndexUnavailableError(
            f"cannot {'remove' if synonyms is None else 'write'} the synonyms of index {holder.name!r}: "
            f"{exc.strerror or exc}"
        ) from None
    return _state(holder)


@router.get("/{name}/synonyms", response_model=SynonymsResponse, responses=RESPONSES)
async def get_synonyms(holder: AdministeredIndexDep) -> SynonymsResponse:
    """The index-level synonyms and the served version's own."""
    return await anyio.to_thread.run_sync(_state, holder)


@router.put(
    "/{name}/synonyms",
    response_model=SynonymsResponse,
    responses={**RESPONSES, 422: {"description": "A malformed set, a limit passed, or a cycle (named)."}},
)
async def put_synonyms(holder: AdministeredIndexDep, body: SynonymsDocument) -> SynonymsResponse:
    """Replace the index-level synonyms (written atomically; searches use them from their next query)."""
    try:
        synonyms = parse(body.model_dump(by_alias=True, exclude_none=True))
    except SynonymsError as exc:  # what the schema cannot say: a cycle, a term without words, a duplicate
        raise InvalidInputError(exc.message, loc=("body", *exc.loc)) from None
    return await anyio.to_thread.run_sync(_save, holder, synonyms)


@router.delete("/{name}/synonyms", response_model=SynonymsResponse, responses=RESPONSES)
async def delete_synonyms(holder: AdministeredIndexDep) -> SynonymsResponse:
    """Remove the index-level synonyms (the served version's own stay)."""
    return await anyio.to_thread.run_sync(_save, holder, None)
