"""Pillow rendering of a catalogue image from its attributes.

Each product kind is a list of drawing primitives in unit coordinates (about [-0.5, 0.5]^2): "body"
primitives build the product's silhouette mask (which the colour and pattern fill), "erase" ones cut
holes into it, and "ink"/"paper" ones are details drawn on top in the outline colour or off-white.
All products of an image share one mask, so fill, pattern and outline cost one paste each.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from synthetic.attributes import ProductAttributes

RGB = tuple[int, int, int]

COLOUR_RGB: dict[str, RGB] = {
    "red": (205, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (245, 212, 35),
    "green": (40, 150, 60),
    "blue": (35, 85, 205),
    "purple": (125, 50, 165),
    "pink": (245, 145, 190),
    "brown": (125, 75, 35),
    "black": (30, 30, 30),
    "white": (248, 248, 248),
}
# Four clearly distinct light tones; every product colour (white included, thanks to the outline and a
# drop shadow) stays visible on each.
BACKGROUND_RGB: dict[str, RGB] = {
    "white": (252, 252, 252),
    "grey": (196, 196, 196),
    "beige": (236, 218, 180),
    "light_blue": (180, 214, 242),
}
_INK: RGB = (32, 32, 32)
_PAPER: RGB = (236, 238, 232)

# Horizontal centre of the group, as a fraction of the image width.
_GROUP_X: dict[str, float] = {"left": 0.29, "centre": 0.5, "right": 0.71}
# Per count: slot centres relative to the group centre, and the slot size (fractions of the image).
_SLOTS: dict[int, tuple[tuple[float, float], ...]] = {
    1: ((0.0, 0.0),),
    2: ((0.0, -0.23), (0.0, 0.23)),
    3: ((0.0, -0.32), (0.0, 0.0), (0.0, 0.32)),
    4: ((-0.135, -0.2), (0.135, -0.2), (-0.135, 0.2), (0.135, 0.2)),
}
# Slots are smaller than their spacing so that products never touch: the count stays countable.
_SLOT_SIZE: dict[int, float] = {1: 0.54, 2: 0.42, 3: 0.28, 4: 0.23}


@dataclass(frozen=True)
class Prim:
    """One drawing primitive in unit coordinates.

    kind: polygon/line (coords are x, y pairs), ellipse/rect/rrect/pie/arc (coords are a box x0, y0, x1, y1).
    extra: rrect (radius,), pie (start, end), arc (start, end, width), line (width,); angles in degrees
    clockwise from 3 o'clock as in Pillow, widths as fractions of the product size.
    """

    kind: str
    coords: tuple[float, ...]
    extra: tuple[float, ...] = ()
    tag: str = "body"  # body | erase | ink | paper


def _p(kind: str, *coords: float, extra: tuple[float, ...] = (), tag: str = "body") -> Prim:
    return Prim(kind, coords, extra, tag)


def _polygon(*points: tuple[float, float], tag: str = "body") -> Prim:
    return Prim("polygon", tuple(c for point in points for c in point), (), tag)


SHAPES: dict[str, tuple[Prim, ...]] = {
    "mug": (
        _p("ellipse", -0.02, -0.22, 0.4, 0.2),
        _p("ellipse", 0.07, -0.12, 0.3, 0.1, tag="erase"),
        _p("rrect", -0.4, -0.36, 0.14, 0.4, extra=(0.06,)),
    ),
    "t_shirt": (
        _polygon(
            (-0.17, -0.42),
            (0.17, -0.42),
            (0.48, -0.2),
            (0.37, 0.0),
            (0.26, -0.08),
            (0.26, 0.44),
            (-0.26, 0.44),
            (-0.26, -0.08),
            (-0.37, 0.0),
            (-0.48, -0.2),
        ),
        _p("ellipse", -0.1, -0.52, 0.1, -0.33, tag="erase"),
    ),
    "hat": (
        _p("rrect", -0.26, -0.34, 0.26, 0.2, extra=(0.1,)),
        _p("ellipse", -0.48, 0.08, 0.48, 0.32),
        _p("rect", -0.26, 0.03, 0.26, 0.11, tag="ink"),
    ),
    "bag": (
        _p("ellipse", -0.24, -0.46, 0.24, 0.02),
        _p("ellipse", -0.15, -0.37, 0.15, -0.04, tag="erase"),
        _p("polygon", -0.42, 0.42, 0.42, 0.42, 0.33, -0.12, -0.33, -0.12),
        _p("rect", -0.05, -0.07, 0.05, 0.04, tag="ink"),
    ),
    "lamp": (
        _p("polygon", -0.18, -0.46, 0.18, -0.46, 0.34, -0.04, -0.34, -0.04),
        _p("rect", -0.045, -0.04, 0.045, 0.36),
        _p("rrect", -0.24, 0.34, 0.24, 0.46, extra=(0.04,)),
    ),
    "chair": (
        _p("rrect", -0.3, -0.46, 0.3, 0.02, extra=(0.05,)),
        _p("rect", -0.36, 0.0, 0.36, 0.15),
        _p("rect", -0.34, 0.15, -0.23, 0.46),
        _p("rect", 0.23, 0.15, 0.34, 0.46),
    ),
    "bottle": (
        _p("rrect", -0.2, -0.08, 0.2, 0.46, extra=(0.07,)),
        _p("polygon", -0.2, 0.0, 0.2, 0.0, 0.08, -0.24, -0.08, -0.24),
        _p("rect", -0.08, -0.38, 0.08, -0.2),
        _p("rect", -0.1, -0.47, 0.1, -0.37, tag="ink"),
    ),
    "clock": (
        _p("ellipse", -0.45, -0.45, 0.45, 0.45),
        _p("arc", -0.45, -0.45, 0.45, 0.45, extra=(0, 360, 0.07), tag="ink"),
        _p("line", 0.0, -0.4, 0.0, -0.31, extra=(0.05,), tag="ink"),
        _p("line", 0.4, 0.0, 0.31, 0.0, extra=(0.05,), tag="ink"),
        _p("line", 0.0, 0.4, 0.0, 0.31, extra=(0.05,), tag="ink"),
        _p("line", -0.4, 0.0, -0.31, 0.0, extra=(0.05,), tag="ink"),
        # Ten past ten, the classic product-photo time.
        _p("line", 0.0, 0.0, -0.18, -0.1, extra=(0.06,), tag="ink"),
        _p("line", 0.0, 0.0, 0.24, -0.14, extra=(0.05,), tag="ink"),
    ),
    "umbrella": (
        _p("pie", -0.48, -0.38, 0.48, 0.38, extra=(180, 360)),
        _p("ellipse", -0.48, -0.07, -0.16, 0.07, tag="erase"),
        _p("ellipse", -0.16, -0.07, 0.16, 0.07, tag="erase"),
        _p("ellipse", 0.16, -0.07, 0.48, 0.07, tag="erase"),
        _p("line", 0.0, -0.46, 0.0, 0.34, extra=(0.05,), tag="ink"),
        _p("arc", -0.18, 0.22, 0.0, 0.44, extra=(0, 180, 0.05), tag="ink"),
    ),
    "ball": (
        _p("ellipse", -0.42, -0.42, 0.42, 0.42),
        _p("line", 0.0, -0.42, 0.0, 0.42, extra=(0.035,), tag="ink"),
        _p("line", -0.42, 0.0, 0.42, 0.0, extra=(0.035,), tag="ink"),
        # Sweeps end where the seams meet the ball's rim.
        _p("arc", -1.12, -0.5, -0.12, 0.5, extra=(-40, 40, 0.035), tag="ink"),
        _p("arc", 0.12, -0.5, 1.12, 0.5, extra=(140, 220, 0.035), tag="ink"),
    ),
    "book": (
        _p("rrect", -0.32, -0.44, 0.32, 0.44, extra=(0.03,)),
        _p("line", -0.21, -0.44, -0.21, 0.44, extra=(0.05,), tag="ink"),
        _p("rect", -0.08, -0.28, 0.22, -0.1, tag="paper"),
    ),
    "car": (
        _p("rrect", -0.48, -0.06, 0.48, 0.22, extra=(0.07,)),
        _p("polygon", -0.3, -0.05, -0.17, -0.32, 0.17, -0.32, 0.32, -0.05),
        _p("polygon", -0.23, -0.09, -0.14, -0.27, -0.02, -0.27, -0.02, -0.09, tag="paper"),
        _p("polygon", 0.03, -0.09, 0.03, -0.27, 0.14, -0.27, 0.25, -0.09, tag="paper"),
        _p("ellipse", -0.4, 0.09, -0.14, 0.35, tag="ink"),
        _p("ellipse", 0.14, 0.09, 0.4, 0.35, tag="ink"),
        _p("ellipse", -0.32, 0.17, -0.22, 0.27, tag="paper"),
        _p("ellipse", 0.22, 0.17, 0.32, 0.27, tag="paper"),
    ),
}


@dataclass(frozen=True)
class _Placement:
    """Where one product lands: centre (px), size (px) and mirroring."""

    cx: float
    cy: float
    size: float
    flip: bool

    def point(self, u: float, v: float) -> tuple[float, float]:
        return self.cx + (-u if self.flip else u) * self.size, self.cy + v * self.size

    def box(self, coords: tuple[float, ...]) -> tuple[float, float, float, float]:
        (xa, y0), (xb, y1) = self.point(coords[0], coords[1]), self.point(coords[2], coords[3])
        return min(xa, xb), y0, max(xa, xb), y1

    def angles(self, start: float, end: float) -> tuple[float, float]:
        # Mirroring x maps a Pillow angle t to 180 - t and reverses the sweep.
        return (180 - end, 180 - start) if self.flip else (start, end)

    def width(self, fraction: float) -> int:
        return max(1, round(fraction * self.size))


def _draw_prim(draw: ImageDraw.ImageDraw, prim: Prim, where: _Placement, fill: int | RGB) -> None:
    kind, c, extra = prim.kind, prim.coords, prim.extra
    outline = _INK if prim.tag == "paper" else None
    if kind in ("polygon", "line"):
        points = [where.point(c[i], c[i + 1]) for i in range(0, len(c), 2)]
        if kind == "polygon":
            draw.polygon(points, fill=fill, outline=outline)
        else:
            draw.line(points, fill=fill, width=where.width(extra[0]))
    elif kind == "ellipse":
        draw.ellipse(where.box(c), fill=fill, outline=outline)
    elif kind == "rect":
        draw.rectangle(where.box(c), fill=fill, outline=outline)
    elif kind == "rrect":
        draw.rounded_rectangle(where.box(c), radius=extra[0] * where.size, fill=fill, outline=outline)
    elif kind == "pie":
        draw.pieslice(where.box(c), *where.angles(extra[0], extra[1]), fill=fill)
    elif kind == "arc":
        draw.arc(where.box(c), *where.angles(extra[0], extra[1]), fill=fill, width=where.width(extra[2]))
    else:
        raise ValueError(f"unknown primitive kind {kind!r}")


def _layout(attrs: ProductAttributes, image_size: int, rng: np.random.Generator) -> list[_Placement]:
    """Slot positions for the group with jitter in position and size; mirroring is random per image."""
    group_x = (_GROUP_X[attrs.placement] + rng.uniform(-0.015, 0.015)) * image_size
    group_y = (0.5 + rng.uniform(-0.015, 0.015)) * image_size
    slot = _SLOT_SIZE[attrs.count] * image_size
    flip = bool(rng.integers(2))
    placements = []
    for dx, dy in _SLOTS[attrs.count]:
        size = slot * rng.uniform(0.85, 1.0)
        jitter = rng.uniform(-0.02, 0.02, size=2) * slot
        cx = group_x + dx * image_size + jitter[0]
        cy = group_y + dy * image_size + jitter[1]
        placements.append(_Placement(cx, cy, size, flip))
    return placements


# Pattern feature sizes at 96 px (scaled with the image): stripe and dot periods, check cell sizes.
_PERIODS: tuple[float, ...] = (7.5, 8.0, 8.5, 9.0)
_CHECK_CELLS: tuple[float, ...] = (4.5, 5.0, 5.5, 6.0)


@cache
def _pattern_tile(pattern: str, size: int, variant: int, orientation: int) -> np.ndarray:
    """A uint8 tile (255 = pattern) larger than the image by more than one period, cropped at random.

    Cached per process: computing the pattern per image cost as much as drawing the products.
    """
    scale = size / 96
    full = size + int(np.ceil(2 * max(_PERIODS) * scale))
    yy, xx = np.mgrid[0:full, 0:full].astype(np.float32)
    if pattern == "striped":
        period = _PERIODS[variant] * scale
        coord = (yy, xx, (xx + yy) / np.sqrt(2))[orientation]
        on = (coord % period) < period * 0.5
    elif pattern == "dotted":
        period = _PERIODS[variant] * scale
        radius = period * 0.28
        row = np.floor(yy / period)
        x = xx + (row % 2) * period / 2  # staggered rows
        dx = x % period - period / 2
        dy = yy % period - period / 2
        on = dx * dx + dy * dy <= radius * radius
    elif pattern == "checked":
        cell = _CHECK_CELLS[variant] * scale
        on = (np.floor(xx / cell) + np.floor(yy / cell)) % 2 == 0
    else:
        raise ValueError(f"unknown pattern {pattern!r}")
    return on.astype(np.uint8) * 255


def pattern_mask(pattern: str, size: int, rng: np.random.Generator) -> Image.Image | None:
    """Where the pattern's second colour goes (L mode, 255 = pattern), random phase; None for plain.

    At 96 px stripes are about 4 px wide, dots about 4.5 px, checks 5 px, so they survive a downscale to
    64 px.
    """
    if pattern == "plain":
        return None
    variant = int(rng.integers(len(_PERIODS)))
    orientation = int(rng.integers(3)) if pattern == "striped" else 0
    tile = _pattern_tile(pattern, size, variant, orientation)
    ox, oy = rng.integers(0, tile.shape[0] - size + 1, size=2)
    return Image.fromarray(np.ascontiguousarray(tile[oy : oy + size, ox : ox + size]))


def _outline(mask: Image.Image) -> Image.Image:
    """The one-pixel ring around the mask (3x3 dilation minus the mask), done in numpy for speed."""
    inside = np.asarray(mask)
    padded = np.pad(inside, 1)
    rows = np.maximum(np.maximum(padded[:, :-2], padded[:, 1:-1]), padded[:, 2:])
    dilated = np.maximum(np.maximum(rows[:-2], rows[1:-1]), rows[2:])
    return Image.fromarray(dilated - inside)


def _jitter(rgb: RGB, amount: int, rng: np.random.Generator) -> RGB:
    shifted = np.clip(np.asarray(rgb) + rng.integers(-amount, amount + 1, size=3), 0, 255)
    return (int(shifted[0]), int(shifted[1]), int(shifted[2]))


def _second_colour(rgb: RGB) -> RGB:
    """Pattern colour: a light tint of dark colours, a dark shade of light ones, so base stays dominant."""
    r, g, b = rgb
    luminance = 0.299 * r + 0.587 * g + 0.114 * b
    if luminance < 140:
        return (round(r + (255 - r) * 0.6), round(g + (255 - g) * 0.6), round(b + (255 - b) * 0.6))
    return (round(r * 0.55), round(g * 0.55), round(b * 0.55))


def _silhouette(shape: tuple[Prim, ...], placements: list[_Placement], size: int) -> Image.Image:
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    for where in placements:
        for prim in shape:
            if prim.tag in ("body", "erase"):
                _draw_prim(draw, prim, where, 255 if prim.tag == "body" else 0)
    return mask


def render_image(
    attrs: ProductAttributes, size: int = 96, rng: np.random.Generator | None = None
) -> Image.Image:
    """Draw `attrs.count` products of the given kind, colour and pattern on the background (RGB)."""
    rng = rng if rng is not None else np.random.default_rng()
    background = _jitter(BACKGROUND_RGB[attrs.background], 4, rng)
    canvas = Image.new("RGB", (size, size), background)
    shape = SHAPES[attrs.category]
    placements = _layout(attrs, size, rng)
    mask = _silhouette(shape, placements, size)

    # A hard drop shadow keeps white products visible on the white background.
    shade = tuple(round(c * 0.8) for c in background)
    canvas.paste(shade, mask=ImageChops.offset(mask, max(1, size // 64), max(1, size // 40)))

    base = _jitter(COLOUR_RGB[attrs.colour], 10, rng)
    canvas.paste(base, mask=mask)
    stripes = pattern_mask(attrs.pattern, size, rng)
    if stripes is not None:
        canvas.paste(_second_colour(base), mask=ImageChops.multiply(mask, stripes))
    canvas.paste(_INK, mask=_outline(mask))

    draw = ImageDraw.Draw(canvas)
    for where in placements:
        for prim in shape:
            if prim.tag in ("ink", "paper"):
                _draw_prim(draw, prim, where, _INK if prim.tag == "ink" else _PAPER)
    return canvas
