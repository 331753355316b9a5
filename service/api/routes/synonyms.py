"""Synonyms of a served index (``store.synonyms``): the index-level set, read, replaced and removed by an
admin (the admin key or an API key of scope admin allowed the index). Searches read a change at their next
query (``service.search.synonyms``), in every server process, without a reload."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter
from fastapi import Path as PathParam

from service.api.deps import AdminDep, RuntimeDep
from service.errors import InvalidInputError, ScopeError
from service.synonym_schemas import OneWaySynonyms, SynonymsDocument, SynonymsResponse, TwoWaySynonyms
from store.synonyms import (
    SYNONYMS_FILE,
    SynonymsError,
    SynonymSet,
    delete_index_synonyms,
    file_state,
    index_synonyms_path,
    parse,
    read_document,
    save_index_synonyms,
)

router = APIRouter(prefix="/v1/admin/indexes", tags=["admin"])

IndexName = Annotated[
    str,
    PathParam(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="A served index."),
]
RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong API key."},
    403: {"description": "An API key of scope search, or one not allowed this index."},
    404: {"description": "Admin disabled, or the index is not served."},
}


def _entries(synonyms: SynonymSet | None) -> list[TwoWaySynonyms | OneWaySynonyms]:
    out: list[TwoWaySynonyms | OneWaySynonyms] = []
    for rule in synonyms.rules if synonyms is not None else ():
        body = rule.to_dict()
        out.append(TwoWaySynonyms(**body) if rule.two_way else OneWaySynonyms.model_validate(body))
    return out


def _state(runtime: RuntimeDep, name: str) -> SynonymsResponse:
    """What the route answers: the index-level set and the served version's (blocking: file reads)."""
    holder = runtime.catalogue_holder(name)
    served = holder.served
    version_dir = getattr(served.index, "path", None) if served is not None else None
    problems: list[str] = []

    def read(path: Path) -> SynonymSet | None:
        if file_state(path) is None:
            return None
        try:
            return read_document(path)
        except SynonymsError as exc:
            problems.append(exc.message)
            return None

    path = index_synonyms_path(runtime.settings.index_root, name)
    own = read(Path(version_dir) / SYNONYMS_FILE) if version_dir is not None else None
    return SynonymsResponse(
        index=name,
        synonyms=_entries(read(path)),
        stored=file_state(path) is not None,
        version=served.version if served is not None else None,
        version_synonyms=_entries(own),
        problem="; ".join(problems) or None,
    )


def _check(runtime: RuntimeDep, admin: AdminDep, name: str) -> None:
    if admin is not None and not admin.allows_index(name):
        raise ScopeError(f"this API key may not administer index {name!r}", loc=("path", "name"))
    runtime.catalogue_holder(name)  # 404 for an index this process does not serve


@router.get("/{name}/synonyms", response_model=SynonymsResponse, responses=RESPONSES)
async def get_synonyms(admin: AdminDep, runtime: RuntimeDep, name: IndexName) -> SynonymsResponse:
    """The index-level synonyms and the served version's own."""
    _check(runtime, admin, name)
    return await anyio.to_thread.run_sync(_state, runtime, name)


@router.put(
    "/{name}/synonyms",
    response_model=SynonymsResponse,
    responses={**RESPONSES, 422: {"description": "A malformed set, a limit passed, or a cycle (named)."}},
)
async def put_synonyms(
    admin: AdminDep, runtime: RuntimeDep, name: IndexName, body: SynonymsDocument
) -> SynonymsResponse:
    """Replace the index-level synonyms (written atomically; searches use them from their next query)."""
    _check(runtime, admin, name)
    try:
        synonyms = parse(body.model_dump(by_alias=True, exclude_none=True))
    except SynonymsError as exc:  # what the schema cannot say: a cycle, a term without words, a duplicate
        raise InvalidInputError(exc.message, loc=("body", *exc.loc)) from None
    root = runtime.settings.index_root
    await anyio.to_thread.run_sync(save_index_synonyms, root, name, synonyms)
    return await anyio.to_thread.run_sync(_state, runtime, name)


@router.delete("/{name}/synonyms", response_model=SynonymsResponse, responses=RESPONSES)
async def delete_synonyms(admin: AdminDep, runtime: RuntimeDep, name: IndexName) -> SynonymsResponse:
    """Remove the index-level synonyms (the served version's own stay)."""
    _check(runtime, admin, name)
    await anyio.to_thread.run_sync(delete_index_synonyms, runtime.settings.index_root, name)
    return await anyio.to_thread.run_sync(_state, runtime, name)
