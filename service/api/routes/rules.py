"""Merchandising rules of a served index (``service.search.rules``), edited with the admin key or an API key
of scope admin: list, read, write (create or replace) and delete. Stored beside the index's versions
(``store.rules``), so a rule outlives rebuilds; every server process re-reads the file when it changes.

A rule is checked against the version served when it is written: a filter naming a field that version does
not have, or a pin of a product it does not hold, is a 422 naming the field."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Response

from service.api.deps import AdministeredIndexDep, RuntimeDep
from service.errors import ConflictError, IndexUnavailableError, InvalidInputError, NotFoundError
from service.index_holder import IndexHolder, Served
from service.rule_schemas import LIMITS, MAX_RULES, PinAction, Rule, RuleBody, RuleId, RuleList
from service.runtime import Runtime
from store.errors import IndexFormatError
from store.rules import RulesFile, read_rules, rules_lock, write_rules

router = APIRouter(prefix="/v1/admin/indexes/{name}/rules", tags=["admin"])

RuleIdPath = Annotated[RuleId, Path(description="The rule's id: letters, digits, '.', '_', '-'; 64 at most.")]
ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong API key."},
    403: {"description": "An API key of scope search, or of other indexes."},
    404: {"description": "Admin disabled, the index is not served here, or no such rule."},
    409: {"description": "The index's rules file cannot be read (fix or delete it)."},
}


def _read(holder: IndexHolder) -> RulesFile:
    try:
        return read_rules(holder.root, holder.name)
    except IndexFormatError as exc:
        raise ConflictError(f"the rules of index {holder.name!r} cannot be read: {exc}") from None


def _rules(file: RulesFile) -> list[Rule]:
    """The stored rules that are valid rules (a hand-edited one that is not is left out, as searches do)."""
    out = []
    for raw in file.rules:
        try:
            out.append(Rule.model_validate(raw))
        except ValueError:
            continue
    return out


def _check(served: Served, body: RuleBody) -> None:
    """A 422 naming the field for a filter field or pinned product the served version does not have."""
    fields = served.index.fields
    for n, action in enumerate(body.actions):
        if isinstance(action, PinAction):
            if served.index.row_of(action.pin) is None:
                raise InvalidInputError(
                    f"no product {action.pin!r} in the served version {served.version}",
                    loc=("body", "actions", n, "pin"),
                )
            continue
        kind = next(k for k in ("boost", "bury", "hide") if hasattr(action, k))
        flt = getattr(action, kind)
        for field in flt:
            if field not in fields:
                raise InvalidInputError(
                    f"unknown filter field {field!r}; known fields: {', '.join(sorted(fields)) or 'none'}",
                    loc=("body", "actions", n, kind, field),
                )


def _put(runtime: Runtime, holder: IndexHolder, rule_id: str, body: RuleBody) -> Rule:
    rule = Rule(id=rule_id, **body.model_dump())
    with holder.lease() as served:
        _check(served, body)
        try:
            with rules_lock(holder.root, holder.name):
                current = _read(holder)
                rules = list(current.rules)
                stored = rule.model_dump(mode="json", exclude_none=True)
                at = next((i for i, r in enumerate(rules) if r["id"] == rule_id), None)
                if at is None:
                    if len(rules) >= MAX_RULES:
                        raise InvalidInputError(
                            f"index {holder.name!r} has {len(rules)} rules, the most an index takes "
                            f"({MAX_RULES}); delete one first",
                            loc=("path", "rule_id"),
                        )
                    rules.append(stored)
                else:
                    rules[at] = stored
                written = write_rules(holder.root, holder.name, rules)
        except OSError as exc:  # the old rules stay as they were (an atomic replace)
            raise IndexUnavailableError(
                f"cannot write the rules of index {holder.name!r}: {exc.strerror}"
            ) from None
        runtime.pipeline.rules.refresh(served, written)  # encoded now, not at the next search
    return rule


def _delete(runtime: Runtime, holder: IndexHolder, rule_id: str) -> None:
    try:
        with rules_lock(holder.root, holder.name):
            current = _read(holder)
            if current.get(rule_id) is None:
                raise NotFoundError(f"no rule {rule_id!r} in index {holder.name!r}", loc=("path", "rule_id"))
            written = write_rules(holder.root, holder.name, [r for r in current.rules if r["id"] != rule_id])
    except OSError as exc:
        raise IndexUnavailableError(
            f"cannot write the rules of index {holder.name!r}: {exc.strerror}"
        ) from None
    served = holder.served
    if served is not None:
        runtime.pipeline.rules.refresh(served, written)


@router.get("", response_model=RuleList, responses=ADMIN_ERRORS)
async def list_rules(holder: AdministeredIndexDep) -> RuleList:
    """Every rule of the index, in the order written, with the limits rules are held to."""
    file = await anyio.to_thread.run_sync(_read, holder)
    return RuleList(rules=_rules(file), etag=file.etag, limits=LIMITS)


@router.get("/{rule_id}", response_model=Rule, responses=ADMIN_ERRORS)
async def get_rule(holder: AdministeredIndexDep, rule_id: RuleIdPath) -> Rule:
    file = await anyio.to_thread.run_sync(_read, holder)
    found = next((r for r in _rules(file) if r.id == rule_id), None)
    if found is None:
        raise NotFoundError(f"no rule {rule_id!r} in index {holder.name!r}", loc=("path", "rule_id"))
    return found


@router.put(
    "/{rule_id}",
    response_model=Rule,
    responses={
        **ADMIN_ERRORS,
        422: {
            "description": "An invalid rule, a filter naming no field or one the served version lacks, a pin "
            "of a product it does not hold, or more rules than an index takes."
        },
        503: {"description": "No version of the index is served, or the rules could not be written."},
    },
)
async def put_rule(
    runtime: RuntimeDep, holder: AdministeredIndexDep, rule_id: RuleIdPath, body: RuleBody
) -> Rule:
    """Create or replace a rule. It acts on searches from the next one on, in every server process."""
    return await anyio.to_thread.run_sync(_put, runtime, holder, rule_id, body)


@router.delete("/{rule_id}", status_code=204, responses=ADMIN_ERRORS)
async def delete_rule(runtime: RuntimeDep, holder: AdministeredIndexDep, rule_id: RuleIdPath) -> Response:
    await anyio.to_thread.run_sync(_delete, runtime, holder, rule_id)
    return Response(status_code=204)
