"""The one door of every route that reads the served index version: text, image and consistency search,
and the catalogue's image files.

Each request leases the served version once, inside the worker thread doing its blocking work (a swap
meanwhile does not close the version), runs its pipeline there and hands what it did to the telemetry. A
short text search (``SearchPipeline.is_short``: ~1 ms of CPU) runs on the event loop instead: the hop to a
worker thread and back cost more than that under load. The
routes only parse HTTP, call one method and answer. (``/v1/index`` reads the opened version's attributes
under a lease of its own on the event loop: no I/O, no pipeline.)

Order of answers: request validation first (422), then whether an index is loaded (503), as text search
always did; the image search checks for an index before it reads the upload or waits for a decoding slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import anyio
from fastapi import UploadFile

from service.errors import BusyError
from service.index_holder import IndexHolder, Served
from service.item_images import ItemFile, item_thumbnail, open_item_file
from service.memory import trim_freed_memory
from service.schemas import (
    ConsistencyRequest,
    ConsistencyResponse,
    FacetSpec,
    ImageSearchResponse,
    SearchRequest,
    SearchResponse,
    SimilarRequest,
)
from service.search.facets import facets_from_form
from service.search.filters import SearchFilters
from service.search.pipeline import SearchPipeline
from service.search.telemetry import SearchTelemetry
from service.upload_budget import UploadBudget
from service.uploads import decode_cost

IMAGE_SLOT_WAIT_S = 10.0  # how long an image search waits for a decoding slot before a 503 (the default)
# Uploads' headers read at once (to learn a decode's cost; WebP's reader takes the whole file).
HEADER_READERS = 2


class TextAnswer(NamedTuple):
    response: SearchResponse
    lang: str  # the query language's metric label (``SearchTelemetry.lang_label``)


class SearchFacade:
    """Made in the app's lifespan (the image slots belong to its event loop)."""

    def __init__(
        self,
        *,
        holder: IndexHolder,
        pipeline: SearchPipeline,
        telemetry: SearchTelemetry,
        limiter: anyio.CapacityLimiter,
        image_slots: int,
        upload_budget: UploadBudget,
        image_slot_wait_s: float = IMAGE_SLOT_WAIT_S,
        inline: bool = False,
    ) -> None:
        self.holder = holder
        self.inline = inline  # short text searches on the event loop (CCRK_INLINE_TEXT_SEARCH)
        self.pipeline = pipeline
        self.telemetry = telemetry
        self.limiter = limiter  # the runtime's bound on worker threads doing CPU work
        # Decoding an upload takes up to ~100 MB and seconds of CPU: a few at a time; the rest wait on the
        # event loop (holding no worker thread, so text searches are not queued behind them).
        self.image_slots = anyio.Semaphore(image_slots)
        self.image_slot_wait_s = image_slot_wait_s  # for the budget, then for a slot (settings.image_wait_s)
        # What uploads may hold at once, bytes and decodes (service.upload_budget): reserved before the
        # upload is read, so 40 clients cannot take the process past its memory limit.
        self.upload_budget = upload_budget
        self.header_readers = anyio.CapacityLimiter(HEADER_READERS)

    # -- searches --------------------------------------------------------------------------------------------

    async def text(self, request: SearchRequest) -> TextAnswer:
        """A text search: on the event loop when it is short (``SearchPipeline.is_short``, judged on the
        very version the search then uses: one lease), else in a worker thread."""
        if self.inline:
            with self.holder.lease() as served:
                if self.pipeline.is_short(served, request):
                    return self._answer(served, request)
        return await anyio.to_thread.run_sync(self._text, request, limiter=self.limiter)

    def _text(self, request: SearchRequest) -> TextAnswer:
        with self.holder.lease() as served:
            return self._answer(served, request)

    def _answer(self, served: Served, request: SearchRequest) -> TextAnswer:
        outcome = self.pipeline.text(served, request)
        return TextAnswer(outcome.response, self.telemetry.text(request, outcome))

    async def image(
        self,
        upload: UploadFile,
        *,
        top_k: int,
        offset: int,
        filters: str | None,
        facets: str | None = None,
        logged: Callable[[bytes, ImageSearchResponse], ImageSearchResponse] | None = None,
    ) -> ImageSearchResponse:
        """A search by an uploaded image; ``filters`` and ``facets`` are the form fields' JSON text.
        ``logged``: given the upload's bytes and the answer, the answer to send (the query log's, with its
        query id: ``service.analytics``)."""
        parsed = SearchFilters.from_form(filters)  # a 422 before the upload is read or waits for a slot
        specs = facets_from_form(facets)
        # No index loaded: the 503 at once, not after reading the upload and waiting up to
        # image_slot_wait_s for a slot (a lease taken and returned: a lock, no I/O).
        with self.holder.lease():
            pass
        cost = await anyio.to_thread.run_sync(self._upload_cost, upload, limiter=self.header_readers)
        async with self.upload_budget.reserve(cost, wait_s=self.image_slot_wait_s):
            data = await upload.read(self.pipeline.max_upload_bytes + 1)  # one byte over: too large, a 413
            try:
                with anyio.fail_after(self.image_slot_wait_s):
                    await self.image_slots.acquire()
            except TimeoutError:
                raise BusyError(
                    "too many image searches at once; retry in a moment "
                    f"(waited {self.image_slot_wait_s:.0f} s)",
                    loc=("body", "file"),
                ) from None
            try:
                response = await anyio.to_thread.run_sync(
                    self._image, data, upload.content_type, top_k, offset, parsed, specs, limiter=self.limiter
                )
            finally:
                self.image_slots.release()
            if logged is None:
                return response
            return await anyio.to_thread.run_sync(logged, data, response)  # a digest of the upload

    def _upload_cost(self, upload: UploadFile) -> int:
        """The upload's bytes once read, and its decode's, known from its header (``service.uploads``)."""
        size, limit = upload.size, self.pipeline.max_upload_bytes
        if size is None or size > limit:
            return limit + 1  # what is read of it: one byte over the limit (a 413)
        vision = self.pipeline.encoder.config.vision
        return size + decode_cost(
            upload.file, max_pixels=self.pipeline.max_query_pixels, image_size=vision.image_size
        )

    def _image(
        self,
        data: bytes,
        content_type: str | None,
        top_k: int,
        offset: int,
        filters: SearchFilters | None,
        facets: list[FacetSpec] | None = None,
    ) -> ImageSearchResponse:
        try:
            with self.holder.lease() as served:
                outcome = self.pipeline.image(
                    served, data, content_type, top_k=top_k, offset=offset, filters=filters, facets=facets
                )
        finally:
            trim_freed_memory()  # the decode's frames back to the system (service.memory)
        self.telemetry.image(outcome)
        return outcome.response

    async def consistency(self, body: ConsistencyRequest) -> ConsistencyResponse:
        return await anyio.to_thread.run_sync(self._consistency, body, limiter=self.limiter)

    def _consistency(self, body: ConsistencyRequest) -> ConsistencyResponse:
        with self.holder.lease() as served:
            outcome = self.pipeline.consistency(served, body)
        self.telemetry.consistency(outcome)
        return outcome.response

    async def similar(self, item_id: str, body: SimilarRequest) -> ImageSearchResponse:
        return await anyio.to_thread.run_sync(self._similar, item_id, body, limiter=self.limiter)

    def _similar(self, item_id: str, body: SimilarRequest) -> ImageSearchResponse:
        with self.holder.lease() as served:
            return self.pipeline.similar(served, item_id, body)

    # -- catalogue images ---------------------------------------------------------------------------------

    async def image_file(self, item_id: str, photo: int = 0) -> ItemFile:
        """An item's image file (a product's ``photo``-th), opened and checked (``service.item_images``); the
        caller closes it. A lookup and an open, not CPU work: no slot of the CPU limiter."""
        return await anyio.to_thread.run_sync(self._image_file, item_id, photo)

    def _image_file(self, item_id: str, photo: int) -> ItemFile:
        with self.holder.lease() as served:
            return open_item_file(served, item_id, photo)

    async def thumbnail(self, item_id: str, size: int, photo: int = 0) -> bytes:
        """A JPEG thumbnail of an item's image (decoding: a slot of the CPU limiter)."""
        return await anyio.to_thread.run_sync(self._thumbnail, item_id, size, photo, limiter=self.limiter)

    def _thumbnail(self, item_id: str, size: int, photo: int) -> bytes:
        try:
            with self.holder.lease() as served:
                return item_thumbnail(served, item_id, size, photo)
        finally:
            trim_freed_memory()
