"""Swin relative-position bias tables moved to another window size as the official CCRk/X-VLM code does
(bicubic on BEiT's geometric grid), for loading the 224 px release into the 384 px fine-tuning shape.

Kept apart from the key mapping (``model.official_checkpoint``) because it is numerics, tested on its own
against SciPy's spline and closed-form references.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.interpolate import RectBivariateSpline
from timm.models.swin_transformer import SwinTransformer

from model.modeling import CheckpointError


def beit_source_grid(src_size: int, dst_size: int) -> np.ndarray:
    """Coordinates BEiT's resize gives the ``src_size`` rows of a relative-position table (``2 * window - 1``)
    so that they stretch over the ``dst_size`` target rows: ``-d[::-1] + [0] + d``, where ``d`` are the
    partial sums of a geometric progression whose ratio q in [1.01, 1.5] is found by bisection until the
    progression's sum reaches ``dst_size // 2``. The float operations are those of the official code (and of
    timm's ``resize_rel_pos_bias_table``), so the grid is bit for bit theirs."""
    left, right = 1.01, 1.5
    q = (left + right) / 2.0
    while right - left > 1e-6:
        q = (left + right) / 2.0
        progression = (1.0 - q ** (src_size // 2)) / (1.0 - q)
        if progression > dst_size // 2:
            right = q
        else:
            left = q
    dis: list[float] = []
    cur = 1.0
    for i in range(src_size // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return np.asarray([-d for d in reversed(dis)] + [0.0] + dis, dtype=np.float64)


def beit_target_grid(dst_size: int) -> np.ndarray:
    """The target rows' coordinates, ``-t .. t`` in steps of 1 with ``t = dst_size // 2`` (official code)."""
    t = dst_size // 2.0
    return np.arange(-t, t + 0.1, 1.0)


def resize_relative_position_bias(table: torch.Tensor, src_window: int, dst_window: int) -> torch.Tensor:
    """Resize a Swin relative-position bias table from a square ``src_window`` to a square ``dst_window``
    as the official CCRk/X-VLM code does when it fine-tunes the 224 px release at 384 px.

    Each head's table, viewed as ``(2 * src_window - 1)`` squared, is placed on BEiT's geometric grid
    (:func:`beit_source_grid`) and the bicubic interpolating spline through it (``interp2d(kind='cubic')`` in
    the official code) is read at the integer target offsets (:func:`beit_target_grid`). timm 1.x resizes on
    the same grid but linearly (SciPy 1.14 removed ``interp2d``): not the tables the model was tuned with.

    Args:
        table: ``((2 * src_window - 1) ** 2, heads)``.
        src_window, dst_window: window sizes (the table has ``2 * window - 1`` rows and columns).

    Returns:
        ``((2 * dst_window - 1) ** 2, heads)`` in ``table``'s dtype and device; ``table`` itself when the
        windows are equal.

    Raises:
        CheckpointError: the table does not have ``src_window``'s size, or ``src_window`` is below 3 (a cubic
            needs 4 rows).
    """
    src, dst = 2 * src_window - 1, 2 * dst_window - 1
    if table.ndim != 2 or table.shape[0] != src * src:
        raise CheckpointError(
            f"relative-position table of shape {tuple(table.shape)} is not ({src * src}, heads) "
            f"for window {src_window}"
        )
    if src == dst:
        return table
    if src < 4:
        raise CheckpointError(
            f"a window-{src_window} relative-position table is too small to resize bicubically "
            "(a cubic needs 4 rows: window 3 or more)"
        )
    grid, target = beit_source_grid(src, dst), beit_target_grid(dst)
    # float32 values, as the official code hands them to SciPy. interp2d(kind='cubic') on a grid fits
    # FITPACK's interpolating bicubic spline, which RectBivariateSpline(s=0) fits too; the grid is the same
    # on both axes, so interp2d's (x, y) order needs no transpose.
    values = table.detach().float().cpu().numpy().reshape(src, src, -1)
    resized = np.stack(
        [
            RectBivariateSpline(grid, grid, values[:, :, head], kx=3, ky=3, s=0)(target, target)
            for head in range(values.shape[2])
        ],
        axis=-1,
    ).reshape(dst * dst, -1)
    return torch.from_numpy(resized).to(dtype=table.dtype, device=table.device)


REL_POS_TABLE = "relative_position_bias_table"


def square_window(backbone: SwinTransformer, key: str) -> int | None:
    """The window of the attention module owning table ``key``, or None when it is not square."""
    height, width = backbone.get_submodule(key[: -len(REL_POS_TABLE) - 1]).window_size
    return int(height) if height == width else None


def table_window(table: torch.Tensor) -> int | None:
    """The square window a ``((2w - 1) ** 2, heads)`` table was made for, or None when it fits none."""
    side = math.isqrt(table.shape[0]) if table.ndim == 2 else 0
    return (side + 1) // 2 if side % 2 == 1 and side * side == table.shape[0] else None
