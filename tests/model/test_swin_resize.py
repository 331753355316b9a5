"""The official resize of Swin relative-position tables (bicubic on BEiT's grid) and the official presets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

from model.configs import CLIP_MEAN, CLIP_STD, get_preset, list_presets
from model.modeling import CCRkModel, CheckpointError
from model.official_checkpoint import load_official_checkpoint, to_official_state_dict
from model.preprocessing import ImagePreprocessor
from model.swin_resize import beit_source_grid, beit_target_grid, resize_relative_position_bias
from tests.tiny import tiny_config

# BEiT's grid for window 7 -> 12 (13 -> 23 rows), from the official bisection: q = 1.3174..., the outer
# offset lands 1.9e-5 beyond the target's 11.
GRID_7_TO_12 = [
    -11.000018595002512,
    -8.059825406854383,
    -5.690085437496803,
    -3.780119947811456,
    -2.240723972320556,
    -1.0,
    0.0,
    1.0,
    2.240723972320556,
    3.780119947811456,
    5.690085437496803,
    8.059825406854383,
    11.000018595002512,
]
# Window 4 -> 6 (7 -> 11 rows): q stops at the 1.5 bound, so the targets +-5 lie beyond +-4.75 and take the
# edge value (FITPACK clamps evaluation points to the data range).
GRID_4_TO_6 = [-4.749996261597554, -2.49999906539917, -1.0, 0.0, 1.0, 2.49999906539917, 4.749996261597554]

# scipy.interpolate.RectBivariateSpline(grid, grid, head, kx=3, ky=3, s=0)(target, target) of the tables
# below (computed with SciPy 1.17.1, float64): row -> (head 0, head 1).
SPLINE_7_TO_12 = {
    0: (-2.2990447306154995e-05, 0.36156658834075556),
    1: (0.22059029973085154, 0.5616009936590133),
    24: (-1.164641433271035, -1.5941579759169078),
    100: (-0.12382399538548916, -0.32076952341147535),
    264: (-0.622437536716461, -0.2972875237464903),
    300: (0.6194568428902668, 0.48972388606346645),
    528: (-0.9742466438904328, -0.8268980894909576),
}
SPLINE_4_TO_6 = {
    0: (0.9999999999999999, 0.819648027420044),
    5: (-0.8686093688011167, -0.42809969186782837),
    12: (0.19329986359357573, -1.3395164248144587),
    60: (-0.5355252027511584, 0.044856030493974686),
    120: (-0.4264255166053772, -0.8676907420158386),
}


def table_7() -> torch.Tensor:
    return torch.sin(torch.arange(169 * 2, dtype=torch.float32).reshape(169, 2) * 0.37)


def table_4() -> torch.Tensor:
    return torch.cos(torch.arange(49 * 2, dtype=torch.float32).reshape(49, 2) * 0.61)


def test_beit_grids() -> None:
    np.testing.assert_allclose(beit_source_grid(13, 23), GRID_7_TO_12, rtol=0, atol=1e-12)
    np.testing.assert_allclose(beit_source_grid(7, 11), GRID_4_TO_6, rtol=0, atol=1e-12)
    # Independently: the offsets are the partial sums 1, 1 + q, ..., 1 + q + ... + q^5 = 23 // 2 = 11.
    q = max(r.real for r in np.roots([1, 1, 1, 1, 1, 1 - 11]) if abs(r.imag) < 1e-12 and r.real > 0)
    partial = np.cumsum(q ** np.arange(6))
    np.testing.assert_allclose(beit_source_grid(13, 23)[7:], partial, atol=1e-4)
    assert beit_target_grid(23).tolist() == list(range(-11, 12))
    assert beit_target_grid(11).tolist() == list(range(-5, 6))


@pytest.mark.parametrize(
    ("table", "src_window", "dst_window", "reference"),
    [(table_7(), 7, 12, SPLINE_7_TO_12), (table_4(), 4, 6, SPLINE_4_TO_6)],
)
def test_resize_equals_the_fitpack_spline(
    table: torch.Tensor, src_window: int, dst_window: int, reference: dict[int, tuple[float, float]]
) -> None:
    resized = resize_relative_position_bias(table, src_window, dst_window)
    assert resized.shape == ((2 * dst_window - 1) ** 2, 2) and resized.dtype == torch.float32
    for row, values in reference.items():
        np.testing.assert_allclose(resized[row].numpy(), values, rtol=0, atol=1e-6, err_msg=f"row {row}")


def test_resize_equals_rect_bivariate_spline_on_random_tables() -> None:
    from scipy import interpolate

    gen = torch.Generator().manual_seed(3)
    table = torch.randn(169, 4, generator=gen)
    grid, target = np.asarray(GRID_7_TO_12), np.arange(-11.0, 12.0)
    reference = np.stack(
        [
            interpolate.RectBivariateSpline(grid, grid, table[:, h].view(13, 13).numpy(), kx=3, ky=3, s=0)(
                target, target
            ).reshape(-1)
            for h in range(4)
        ],
        axis=-1,
    )
    resized = resize_relative_position_bias(table, 7, 12).numpy()
    np.testing.assert_allclose(resized, reference, rtol=0, atol=2e-6)


def test_a_cubic_is_reproduced_exactly_where_a_linear_resize_is_not() -> None:
    def cubic(y: np.ndarray, x: np.ndarray) -> np.ndarray:
        return 1e-3 * x**3 - 5e-4 * y**3 + 8e-4 * x * y**2 + 4e-3 * x**2 - 0.05 * y + 0.3

    grid = np.asarray(GRID_7_TO_12)
    rows, cols = np.meshgrid(grid, grid, indexing="ij")  # table row = y offset, column = x offset
    heads = [cubic(rows, cols), cubic(cols, rows)]
    table = torch.from_numpy(np.stack([h.reshape(-1) for h in heads], axis=-1)).float()
    target = np.arange(-11.0, 12.0)
    trow, tcol = np.meshgrid(target, target, indexing="ij")
    expected = np.stack([cubic(trow, tcol).reshape(-1), cubic(tcol, trow).reshape(-1)], axis=-1)

    cubic_resized = resize_relative_position_bias(table, 7, 12).numpy()
    assert np.abs(cubic_resized - expected).max() <= 1e-5
    linear = resize_rel_pos_bias_table(table, new_window_size=(12, 12), new_bias_shape=(529, 2)).numpy()
    assert np.abs(linear - expected).max() > 1e-2  # timm's resize of the same grid is linear


def test_resize_edge_cases() -> None:
    table = table_7()
    assert resize_relative_position_bias(table, 7, 7) is table
    with pytest.raises(CheckpointError, match="window 6"):
        resize_relative_position_bias(table, 6, 12)
    with pytest.raises(CheckpointError, match="too small"):
        resize_relative_position_bias(torch.zeros(9, 2), 2, 4)


def test_loading_into_a_larger_window_uses_the_cubic_tables(tmp_path: Path) -> None:
    """The 224 -> 384 px move in miniature: a window-4 checkpoint at 32 px into window 5 at 40 px."""
    torch.manual_seed(0)
    source = CCRkModel(tiny_config(width=64, depths=(2, 2), vocab_size=300)).eval()
    with torch.no_grad():
        for param in source.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    sd = to_official_state_dict(source)
    target_cfg = tiny_config(width=64, depths=(2, 2), vocab_size=300)
    target_cfg.vision.image_size = 40
    target_cfg.vision.backbone_kwargs["window_size"] = 5
    path = tmp_path / "window4.th"
    torch.save({"model": sd}, path)
    loaded, report = load_official_checkpoint(path, target_cfg, strict=True)

    assert report.ok, report.summary()
    assert any("bicubically" in note and "4 relative-position" in note for note in report.notes)
    backbone = loaded.vision_encoder.backbone
    tables = {k: v for k, v in backbone.state_dict().items() if k.endswith("relative_position_bias_table")}
    assert len(tables) == 4 and all(v.shape[0] == 81 for v in tables.values())
    for key, table in tables.items():
        checkpoint_table = sd[f"vision_encoder.{key}"]  # block keys are the same in both Swin layouts
        assert checkpoint_table.shape[0] == 49
        assert torch.equal(table, resize_relative_position_bias(checkpoint_table, 4, 5)), key
        linear = resize_rel_pos_bias_table(checkpoint_table, (5, 5), tuple(table.shape))
        assert not torch.allclose(table, linear, atol=1e-4), key
    # Everything else arrives unchanged.
    same = [k for k in source.state_dict() if "relative_position" not in k and "attn_mask" not in k]
    for key in same:
        assert torch.equal(source.state_dict()[key], loaded.state_dict()[key]), key


def test_official_presets() -> None:
    assert {"ccrk-paper-224", "ccrk-paper"} <= set(list_presets())
    assert CLIP_MEAN == (0.48145466, 0.4578275, 0.40821073)
    assert CLIP_STD == (0.26862954, 0.26130258, 0.27577711)
    release, tuned = get_preset("ccrk-paper-224"), get_preset("ccrk-paper")
    assert release.vision.backbone == "swin_base_patch4_window7_224"
    assert release.vision.image_size == 224 and release.vision.backbone_kwargs == {"window_size": 7}
    assert tuned.vision.backbone == "swin_base_patch4_window12_384"
    assert tuned.vision.image_size == 384 and tuned.vision.backbone_kwargs == {"window_size": 12}
    for cfg in (release, tuned):
        assert cfg.vision.mean == CLIP_MEAN and cfg.vision.std == CLIP_STD
        assert cfg.vision.crop_pct is None  # the whole image, resized: no centre crop
    assert release.text == tuned.text and release.embed_dim == tuned.embed_dim == 256
    with torch.device("meta"):
        model = CCRkModel(release)
    attn = model.vision_encoder.backbone.layers[0].blocks[0].attn
    assert attn.window_size == (7, 7) and tuple(attn.relative_position_bias_table.shape) == (169, 4)
    assert model.vision_encoder.width == 1024


def test_release_preset_preprocessing_is_clips() -> None:
    pre = ImagePreprocessor(get_preset("ccrk-paper-224").vision)
    # A wide image, left half white, right half black: resized whole (no crop), so both halves survive.
    image = Image.new("RGB", (448, 224), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 224, 224))
    pixels = pre.to_uint8(image)
    assert pixels.shape == (3, 224, 224)
    assert (pixels[:, :, :100] == 255).all() and (pixels[:, :, 124:] == 0).all()
    normalised = pre.normalize(pixels[None])
    white = [(1.0 - m) / s for m, s in zip(CLIP_MEAN, CLIP_STD, strict=True)]
    black = [-m / s for m, s in zip(CLIP_MEAN, CLIP_STD, strict=True)]
    np.testing.assert_allclose(normalised[0, :, 0, 0], white, rtol=1e-6)
    np.testing.assert_allclose(normalised[0, :, 0, -1], black, rtol=1e-6)
