"""Product writes of a served index (``service.live``): ``PATCH`` a product's fields, ``DELETE`` a product,
under ``/v1/indexes/{name}/products/{id}`` and the default index's ``/v1/products/{id}``.

Each write needs the admin key or an API key of scope write (or admin) for that index, and counts against
its key's rate limit. It is answered only once the index's change log holds it durably; with ``wait``
(the default) once this process's searches show it too, and every other process serving the index shows
it within ``CCRK_LIVE_POLL_S``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam

from service.api.deps import IndexName, RuntimeDep, WriteCallerDep
from service.errors import WriteUnavailableError
from service.index_holder import IndexHolder
from service.live.schemas import (
    MAX_BATCH_BYTES,
    MAX_BATCH_LINES,
    MAX_UPSERT_BYTES,
    BatchReceipt,
    DeleteByFilter,
    ProductPatch,
    ProductUpsert,
    WriteReceipt,
)
from service.live.writes import (
    PhotoLimits,
    delete_matching,
    delete_product,
    parse_batch,
    patch_product,
    upsert_product,
    write_batch,
)
from service.runtime import Runtime

router = APIRouter(tags=["products"])

JSON_BODY_LIMIT = 64 * 1024
ProductId = Annotated[str, PathParam(min_length=1, max_length=512, description="The product's id.")]
Wait = Annotated[
    bool,
    Query(description="Answer once this process's searches show the write (else once it is durable)."),
]
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No API key, or an unknown or revoked one."},
    403: {"description": "A key of scope search, or of other indexes."},
    404: {"description": "The index is not served here, or it holds no product of this id."},
    422: {
        "description": "Invalid input; the error names the field (a value of another kind than the "
        "catalogue's, say)."
    },
    429: {"description": "Rate limit or daily quota of the caller; see Retry-After."},
    503: {
        "description": "No index loaded, or the change log did not answer (nothing was written; see "
        "Retry-After)."
    },
}


Receipt = TypeVar("Receipt", WriteReceipt, BatchReceipt)


async def _counted(runtime: Runtime, holder: IndexHolder, kind: str, work: Callable[[], Receipt]) -> Receipt:
    """``work`` in a worker thread, counted in ``ccrk_live_writes_total`` (a batch as its count of changes)
    when durable, or once when refused by a log that did not answer."""
    try:
        receipt = await anyio.to_thread.run_sync(work)
    except WriteUnavailableError:
        runtime.metrics.live_writes.labels(holder.name, kind, "unavailable").inc()
        raise
    count = receipt.count if isinstance(receipt, BatchReceipt) else 1
    runtime.metrics.live_writes.labels(holder.name, kind, "ok").inc(count)
    return receipt


async def _patch(
    runtime: Runtime, holder: IndexHolder, item_id: str, body: ProductPatch, wait: bool
) -> WriteReceipt:
    def work() -> WriteReceipt:
        with holder.lease() as served:
            return patch_product(
                runtime.feed(holder.name),
                served,
                item_id,
                body,
                wait=wait,
                wait_s=runtime.settings.live_wait_s,
            )

    return await _counted(runtime, holder, "patch", work)


async def _delete(runtime: Runtime, holder: IndexHolder, item_id: str, wait: bool) -> WriteReceipt:
    def work() -> WriteReceipt:
        with holder.lease() as served:
            return delete_product(
                runtime.feed(holder.name), served, item_id, wait=wait, wait_s=runtime.settings.live_wait_s
            )

    return await _counted(runtime, holder, "delete", work)


def photo_limits(runtime: Runtime) -> PhotoLimits:
    """An upserted photo's limits: those of an image search's upload."""
    return PhotoLimits(
        max_bytes=runtime.settings.max_upload_mb * 1024 * 1024,
        max_pixels=runtime.settings.max_query_pixels,
        image_size=runtime.pipeline.encoder.config.vision.image_size,
    )


async def _upsert(
    runtime: Runtime, holder: IndexHolder, item_id: str, body: ProductUpsert, wait: bool
) -> WriteReceipt:
    def work() -> WriteReceipt:
        with holder.lease() as served:
            return upsert_product(
                runtime.feed(holder.name),
                served,
                item_id,
                body,
                photo_limits(runtime),
                wait=wait,
                wait_s=runtime.settings.live_wait_s,
            )

    return await _counted(runtime, holder, "upsert", work)


UPSERT_ERRORS: dict[int | str, dict[str, Any]] = {
    **WRITE_ERRORS,
    413: {"description": "A photo over CCRK_MAX_UPLOAD_MB or CCRK_MAX_QUERY_PIXELS, or a body over 48 MiB."},
    415: {"description": "A photo that is not JPEG, PNG or WebP."},
}


@router.put(
    "/v1/indexes/{name}/products/{item_id:path}",
    response_model=WriteReceipt,
    responses=UPSERT_ERRORS,
    max_body_size=MAX_UPSERT_BYTES,
)
async def upsert_indexed_product(
    name: IndexName,
    item_id: ProductId,
    body: ProductUpsert,
    runtime: RuntimeDep,
    caller: WriteCallerDep,
    wait: Wait = True,
) -> WriteReceipt:
    """Add a product, or replace one whole: its fields (searched text fields such as ``title@de`` are
    embedded and indexed) and its photos in base64. With ``wait`` it answers once searches here find it by
    its text and its photos."""
    return await _upsert(runtime, runtime.catalogue_holder(name), item_id, body, wait)


@router.put(
    "/v1/products/{item_id:path}",
    response_model=WriteReceipt,
    responses=UPSERT_ERRORS,
    max_body_size=MAX_UPSERT_BYTES,
)
async def upsert_product_route(
    item_id: ProductId, body: ProductUpsert, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> WriteReceipt:
    """Add or replace one product of the default index (as ``PUT /v1/indexes/{name}/products/{id}``)."""
    return await _upsert(runtime, runtime.holder, item_id, body, wait)


@router.patch(
    "/v1/indexes/{name}/products/{item_id:path}",
    response_model=WriteReceipt,
    responses=WRITE_ERRORS,
    max_body_size=JSON_BODY_LIMIT,
)
async def patch_indexed_product(
    name: IndexName,
    item_id: ProductId,
    body: ProductPatch,
    runtime: RuntimeDep,
    caller: WriteCallerDep,
    wait: Wait = True,
) -> WriteReceipt:
    """Change some fields of one product (price, stock, any metadata)."""
    return await _patch(runtime, runtime.catalogue_holder(name), item_id, body, wait)


@router.delete(
    "/v1/indexes/{name}/products/{item_id:path}", response_model=WriteReceipt, responses=WRITE_ERRORS
)
async def delete_indexed_product(
    name: IndexName, item_id: ProductId, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> WriteReceipt:
    """Delete one product: no search, filter or count shows it any more."""
    return await _delete(runtime, runtime.catalogue_holder(name), item_id, wait)


@router.patch(
    "/v1/products/{item_id:path}",
    response_model=WriteReceipt,
    responses=WRITE_ERRORS,
    max_body_size=JSON_BODY_LIMIT,
)
async def patch_product_route(
    item_id: ProductId, body: ProductPatch, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> WriteReceipt:
    """Change some fields of one product of the default index (as ``/v1/indexes/{name}/products/{id}``)."""
    return await _patch(runtime, runtime.holder, item_id, body, wait)


@router.delete("/v1/products/{item_id:path}", response_model=WriteReceipt, responses=WRITE_ERRORS)
async def delete_product_route(
    item_id: ProductId, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> WriteReceipt:
    """Delete one product of the default index."""
    return await _delete(runtime, runtime.holder, item_id, wait)


BATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "One change per line (NDJSON): "
        '{"op": "upsert", "id": "sku-0", "fields": {"title": "Red mug"}, "photos": [{"data": "<base64>"}]}, '
        '{"op": "patch", "id": "sku-1", "fields": {"price": 7.5}} or {"op": "delete", "id": "sku-2"}; '
        f"at most {MAX_BATCH_LINES} lines.",
        "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
    }
}


async def _batch(runtime: Runtime, holder: IndexHolder, request: Request, wait: bool) -> BatchReceipt:
    lines = parse_batch(await request.body())

    def work() -> BatchReceipt:
        with holder.lease() as served:
            return write_batch(
                runtime.feed(holder.name),
                served,
                lines,
                photo_limits(runtime),
                wait=wait,
                wait_s=runtime.settings.live_wait_s,
            )

    return await _counted(runtime, holder, "batch", work)


async def _delete_matching(
    runtime: Runtime, holder: IndexHolder, body: DeleteByFilter, wait: bool
) -> BatchReceipt:
    def work() -> BatchReceipt:
        with holder.lease() as served:
            return delete_matching(
                runtime.feed(holder.name), served, body, wait=wait, wait_s=runtime.settings.live_wait_s
            )

    return await _counted(runtime, holder, "delete", work)


@router.post(
    "/v1/indexes/{name}/products/batch",
    response_model=BatchReceipt,
    responses=WRITE_ERRORS,
    max_body_size=MAX_BATCH_BYTES,
    openapi_extra=BATCH_BODY,
)
async def batch_indexed_products(
    name: IndexName, request: Request, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> BatchReceipt:
    """Patches and deletes of many products, one per NDJSON line, written in one transaction: all of them
    or none (a line naming an unknown product is a 404, a bad one a 422, naming the line)."""
    return await _batch(runtime, runtime.catalogue_holder(name), request, wait)


@router.post(
    "/v1/products/batch",
    response_model=BatchReceipt,
    responses=WRITE_ERRORS,
    max_body_size=MAX_BATCH_BYTES,
    openapi_extra=BATCH_BODY,
)
async def batch_products(
    request: Request, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> BatchReceipt:
    """A batch of patches and deletes of the default index's products."""
    return await _batch(runtime, runtime.holder, request, wait)


@router.post(
    "/v1/indexes/{name}/products/delete",
    response_model=BatchReceipt,
    responses=WRITE_ERRORS,
    max_body_size=JSON_BODY_LIMIT,
)
async def delete_indexed_matching(
    name: IndexName, body: DeleteByFilter, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> BatchReceipt:
    """Delete every product the filters match (at most 10,000 at once), in one transaction."""
    return await _delete_matching(runtime, runtime.catalogue_holder(name), body, wait)


@router.post(
    "/v1/products/delete", response_model=BatchReceipt, responses=WRITE_ERRORS, max_body_size=JSON_BODY_LIMIT
)
async def delete_matching_route(
    body: DeleteByFilter, runtime: RuntimeDep, caller: WriteCallerDep, wait: Wait = True
) -> BatchReceipt:
    """Delete every product of the default index the filters match."""
    return await _delete_matching(runtime, runtime.holder, body, wait)
