"""Objectives against hand-computed values on small tensors."""

import math

import pytest
import torch
import torch.nn.functional as F

from model.objectives import (
    IGNORE_INDEX,
    info_nce,
    itm_labels,
    kcl_loss,
    mask_tokens,
    sample_hard_negatives,
    sample_hard_positives,
    sample_one_language,
    translation_pair_loss,
)

IMAGES = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
# texts[b, k]: image b's caption in language k (unit vectors).
TEXTS = torch.tensor([[[1.0, 0.0], [0.6, 0.8]], [[0.0, 1.0], [0.8, 0.6]]])


def lse(*xs: float) -> float:
    return math.log(sum(math.exp(x) for x in xs))


def test_kcl_hand_computed() -> None:
    out = kcl_loss(IMAGES, TEXTS, temperature=1.0)
    # Image 0 sees logits (1, .6 | 0, .8), positives 1 and .6 weighted 1/2; image 1 is symmetric.
    expected_i2t = lse(1, 0.6, 0, 0.8) - (1 + 0.6) / 2
    expected_t2i = ((lse(1, 0) - 1) + (lse(0.6, 0.8) - 0.6) + (lse(0, 1) - 1) + (lse(0.8, 0.6) - 0.6)) / 4
    assert out.image_to_text.item() == pytest.approx(expected_i2t, abs=1e-6)
    assert out.text_to_image.item() == pytest.approx(expected_t2i, abs=1e-6)
    assert out.loss.item() == pytest.approx((expected_i2t + expected_t2i) / 2, abs=1e-6)


def test_kcl_temperature_scales_logits() -> None:
    out = kcl_loss(IMAGES, TEXTS, temperature=0.5)
    expected_i2t = lse(2, 1.2, 0, 1.6) - (2 + 1.2) / 2
    assert out.image_to_text.item() == pytest.approx(expected_i2t, abs=1e-6)


def test_kcl_with_k1_equals_infonce() -> None:
    gen = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(6, 8, generator=gen), dim=-1)
    texts = F.normalize(torch.randn(6, 8, generator=gen), dim=-1)
    kcl = kcl_loss(images, texts[:, None, :], 0.07)
    nce = info_nce(images, texts, 0.07)
    assert kcl.loss.item() == pytest.approx(nce.loss.item(), rel=1e-6)
    assert kcl.image_to_text.item() == pytest.approx(nce.image_to_text.item(), rel=1e-6)


def test_kcl_mask_drops_missing_captions() -> None:
    mask = torch.tensor([[True, True], [True, False]])
    out = kcl_loss(IMAGES, TEXTS, 1.0, mask)
    # t11 is gone: image 0 sees (1, .6 | 0); image 1 sees (0, .8 | 1) with one positive of weight 1.
    expected_i2t = ((lse(1, 0.6, 0) - 0.8) + (lse(0, 0.8, 1) - 1)) / 2
    expected_t2i = ((lse(1, 0) - 1) + (lse(0.6, 0.8) - 0.6) + (lse(0, 1) - 1)) / 3
    assert out.image_to_text.item() == pytest.approx(expected_i2t, abs=1e-6)
    assert out.text_to_image.item() == pytest.approx(expected_t2i, abs=1e-6)


def test_kcl_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="does not match"):
        kcl_loss(torch.zeros(3, 2), TEXTS, 1.0)


def test_info_nce_hand_computed() -> None:
    texts = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    out = info_nce(IMAGES, texts, 1.0)
    i2t = ((lse(0.6, 0.8) - 0.6) + (lse(0.8, 0.6) - 0.6)) / 2
    t2i = ((lse(0.6, 0.8) - 0.6) + (lse(0.8, 0.6) - 0.6)) / 2
    assert out.loss.item() == pytest.approx((i2t + t2i) / 2, abs=1e-6)


def test_translation_pair_loss_is_symmetric_infonce() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    assert translation_pair_loss(a, b, 1.0).item() == pytest.approx(info_nce(a, b, 1.0).loss.item())


def test_hard_positive_prefers_worst_aligned_language() -> None:
    # Tiny temperature: the sampling is one-hot on the least similar caption.
    picks = sample_hard_positives(IMAGES, TEXTS, 1e-3)
    assert picks.tolist() == [1, 1]  # image 0: .6 < 1; image 1: .6 < 1
    mask = torch.tensor([[True, False], [True, True]])
    assert sample_hard_positives(IMAGES, TEXTS, 1e-3, mask).tolist() == [0, 1]


def test_hard_positive_sampling_follows_softmax_of_negative_similarity() -> None:
    gen = torch.Generator().manual_seed(0)
    picks = torch.stack([sample_hard_positives(IMAGES, TEXTS, 0.5, generator=gen) for _ in range(4000)])
    share = (picks[:, 0] == 1).float().mean().item()
    expected = math.exp(-0.6 / 0.5) / (math.exp(-0.6 / 0.5) + math.exp(-1 / 0.5))
    assert share == pytest.approx(expected, abs=0.03)


def test_hard_negatives_never_positive_or_duplicate() -> None:
    gen = torch.Generator().manual_seed(1)
    images = F.normalize(torch.randn(5, 4, generator=gen), dim=-1)
    texts = images.clone()
    same = torch.zeros(5, 5, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    for _ in range(200):
        neg_t, neg_i = sample_hard_negatives(images, texts, 0.1, same, gen)
        assert (neg_t != torch.arange(5)).all() and (neg_i != torch.arange(5)).all()
        assert neg_t[0] != 1 and neg_t[1] != 0 and neg_i[0] != 1 and neg_i[1] != 0


def test_hard_negative_is_most_similar_at_low_temperature() -> None:
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    neg_t, neg_i = sample_hard_negatives(images, images, 1e-3)
    assert neg_t.tolist() == [2, 2, 0] and neg_i.tolist() == [2, 2, 0]


def test_one_language_sampling_respects_mask() -> None:
    mask = torch.tensor([[False, True, False], [True, False, False]])
    assert sample_one_language(mask).tolist() == [1, 0]


def test_itm_labels_layout() -> None:
    assert itm_labels(2).tolist() == [1, 1, 0, 0, 0, 0]


def test_mask_tokens_rules() -> None:
    ids = torch.tensor([[0, 10, 11, 12, 13, 2, 1, 1], [0, 20, 2, 1, 1, 1, 1, 1]])
    attn = (ids != 1).long()
    gen = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(
        ids,
        attn,
        mask_token_id=4,
        vocab_size=50,
        special_ids=[0, 1, 2, 3, 4],
        probability=0.15,
        generator=gen,
    )
    picked = labels != IGNORE_INDEX
    assert not picked[ids <= 4].any()  # specials and padding never predicted
    assert picked.any(dim=1).all()  # each row predicts at least one token
    assert (labels[picked] == ids[picked]).all()
    assert (masked[~picked] == ids[~picked]).all()
    # With probability 1 every maskable token is predicted; ~80 % of them become <mask>.
    big = torch.randint(5, 50, (64, 32), generator=gen)
    masked, labels = mask_tokens(big, torch.ones_like(big), 4, 50, [0, 1, 2, 3, 4], 1.0, gen)
    assert (labels == big).all()
    assert (masked == 4).float().mean().item() == pytest.approx(0.8, abs=0.03)
