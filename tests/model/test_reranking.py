import numpy as np
import pytest
import torch

from model.reranking import rerank_order, rerank_scores


def test_scores_are_dual_logit_plus_match_log_odds() -> None:
    sims = np.array([0.5, 0.4, 0.1], dtype=np.float32)
    margins = np.array([-1.0, 2.0, 0.5], dtype=np.float32)
    # 0.5/0.05 - 1 = 9, 0.4/0.05 + 2 = 10, 0.1/0.05 + 0.5 = 2.5
    np.testing.assert_allclose(rerank_scores(sims, margins, 0.05), [9.0, 10.0, 2.5], rtol=1e-6)
    assert rerank_order(sims, margins, 0.05).tolist() == [1, 0, 2]


def test_a_cold_temperature_lets_the_dual_encoder_decide() -> None:
    sims = np.array([0.9, 0.8])
    margins = np.array([-3.0, 3.0])
    assert rerank_order(sims, margins, 0.001).tolist() == [0, 1]
    assert rerank_order(sims, margins, 1.0).tolist() == [1, 0]


def test_ties_keep_the_dual_order_and_torch_works() -> None:
    assert rerank_order(np.zeros(4), np.zeros(4), 0.07).tolist() == [0, 1, 2, 3]
    out = rerank_scores(torch.tensor([0.2]), torch.tensor([1.0]), 0.1)
    assert torch.allclose(out, torch.tensor([3.0]))


@pytest.mark.parametrize("temperature", [0.0, -0.1, float("nan")])
def test_temperature_must_be_positive(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        rerank_scores(np.zeros(1), np.zeros(1), temperature)
