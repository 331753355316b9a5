"""Large allocations handed back to the system when freed (glibc's ``mallopt``).

glibc serves allocations below its mmap threshold from per-thread heaps (arenas), and raises that threshold
(up to 32 MB) each time a large block is freed. An image decode's frames (Pillow's 16 MB blocks, numpy's
planes) then came from the worker threads' arenas, and once freed they stayed in the process: after 40
large uploads the RSS never came back down. A fixed threshold of 1 MB keeps every such block a mapping of its
own, unmapped when freed; queries' small arrays are unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD_BYTES = 1024 * 1024


def map_large_allocations(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold (fixed: no longer raised as blocks are freed); False on another libc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt(M_MMAP_THRESHOLD) refused; freed image memory may stay in the process")
    return ok
