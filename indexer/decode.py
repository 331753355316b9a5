"""Decoding and resizing images in worker processes, with a reason for every file that cannot be used.

A bad file never raises: ``Decoder.__call__`` returns ``(None, kind, detail)``; the build lists it in its
report and goes on. Kinds: missing, zero-byte, not-an-image, truncated, undecodable, decompression-bomb
(more pixels than ``max_pixels``, checked by Pillow's ``MAX_IMAGE_PIXELS`` from the header, before any
pixel is decoded).

Large JPEGs (and MPOs) are decoded at a reduced scale (``model.preprocessing.draft_for``: Pillow's draft,
1/2 to 1/8 in the DCT domain) no smaller than twice the model's input, then converted and resized as
``ImagePreprocessor`` does (the same steps as a query upload); other formats decode in full.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from model.configs import VisionConfig
from model.preprocessing import ImagePreprocessor, draft_for

BAD_KINDS = ("missing", "zero-byte", "not-an-image", "truncated", "undecodable", "decompression-bomb")

DecodeResult = tuple[np.ndarray | None, str | None, str | None]  # pixels (3, S, S) uint8, kind, detail


@contextmanager
def _pillow_limit(max_pixels: int) -> Iterator[None]:
    """Pillow's bomb limit for this call; its warning (over the limit) becomes an error like its error
    (over twice the limit), so both are skipped."""
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = old


@dataclass(frozen=True)
class Decoder:
    """Picklable: sent once to each worker process."""

    vision: VisionConfig
    max_pixels: int

    def __call__(self, path: str) -> DecodeResult:
        p = Path(path)
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            return None, "missing", "file not found"
        except OSError as exc:
            return None, "missing", f"cannot stat: {exc}"
        if not p.is_file():
            return None, "missing", "not a regular file"
        if size == 0:
            return None, "zero-byte", "empty file"
        preprocessor = ImagePreprocessor(self.vision)
        try:
            with _pillow_limit(self.max_pixels), Image.open(p) as image:
                return preprocessor.to_uint8(draft_for(image, self.vision.image_size)), None, None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            return None, "decompression-bomb", str(exc)
        except UnidentifiedImageError:
            return None, "not-an-image", "no image format recognises this file"
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            message = str(exc) or type(exc).__name__
            if "truncated" in message.lower() or isinstance(exc, EOFError):
                return None, "truncated", message
            return None, "undecodable", message
        except Exception as exc:  # a decoder plugin bug must not stop a build either
            return None, "undecodable", f"{type(exc).__name__}: {exc}"


class DecodePool:
    """Decode paths in order, in ``workers`` processes (0: in this process)."""

    def __init__(self, decoder: Decoder, workers: int) -> None:
        self.decoder = decoder
        self.workers = workers
        self._pool = None
        if workers > 0:
            # fork before any ONNX Runtime / torch thread pools exist (the caller creates this first);
            # workers are single-threaded decoders.
            ctx = multiprocessing.get_context("fork")
            self._pool = ctx.Pool(workers)

    def map(self, paths: Iterable[str]) -> Iterator[DecodeResult]:
        if self._pool is None:
            return map(self.decoder, paths)
        return self._pool.imap(self.decoder, paths, chunksize=8)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
