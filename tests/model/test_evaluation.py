"""Evaluation against exact brute-force references."""

import json

import numpy as np
import pytest
import torch

from model.evaluation import EncodedSplit, dual_ranks, evaluate, format_table
from model.metrics import mrv, recall_at_k
from model.modeling import CCRkModel
from model.preprocessing import ImagePreprocessor
from model.tokenization import train_tokenizer
from model.training_data import CaptionedImages
from tests.tiny import tiny_config

LANGS = ("en", "de")


def brute_force_rank(scores: np.ndarray, targets: set[int]) -> int:
    order = sorted(range(len(scores)), key=lambda j: -scores[j])
    return min(order.index(t) for t in targets)


def test_dual_ranks_match_brute_force() -> None:
    gen = torch.Generator().manual_seed(0)
    n, k, c, d = 7, 2, 2, 5
    images = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=-1)
    texts = torch.nn.functional.normalize(torch.randn(n, k, c, d, generator=gen), dim=-1)
    ir, tr = dual_ranks(EncodedSplit(image_embeds=images, text_embeds=texts))
    assert ir.shape == (n * c, k) and tr.shape == (n, k)
    for li in range(k):
        flat = texts[:, li].reshape(n * c, d)
        for q in range(n * c):
            assert ir[q, li] == brute_force_rank((flat[q] @ images.T).numpy(), {q // c})
        for i in range(n):
            assert tr[i, li] == brute_force_rank((images[i] @ flat.T).numpy(), {i * c, i * c + 1})


@pytest.fixture
def tiny_split() -> tuple[CCRkModel, object, CaptionedImages, ImagePreprocessor]:
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.text.vocab_size = 300
    model = CCRkModel(cfg).eval()
    words = ["red", "blue", "green", "mug", "hat", "ball", "rot", "blau", "grün", "Tasse", "Hut", "Ball"]
    captions = [
        {
            "en": [f"{words[i % 3]} {words[3 + i // 3]}", f"a {words[i % 3]} {words[3 + i // 3]}"],
            "de": [f"{words[6 + i % 3]} {words[9 + i // 3]}", f"ein {words[6 + i % 3]} {words[9 + i // 3]}"],
        }
        for i in range(6)
    ]
    tokenizer = train_tokenizer([t for c in captions for v in c.values() for t in v] * 3, 300, 32)
    gen = torch.Generator().manual_seed(1)
    data = CaptionedImages(
        ids=[f"i{i}" for i in range(6)],
        pixels=torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=gen),
        captions=captions,
        languages=LANGS,
        item_keys=[f"i{i}" for i in range(6)],
    )
    return model, tokenizer, data, ImagePreprocessor(cfg.vision)


def test_rerank_matches_pairwise_reference(tiny_split) -> None:
    model, tokenizer, data, pre = tiny_split
    k = 3
    result = evaluate(model, tokenizer, data, pre, rerank_k=k, batch_size=4)
    n, c = len(data), 2
    temperature = float(model.temperature.detach())
    with torch.no_grad():
        pixels = pre.normalize(data.pixels)
        image_out = model.encode_image(pixels)
        for li, lang in enumerate(LANGS):
            texts = [data.captions[i][lang][j] for i in range(n) for j in range(c)]
            # One query at a time, one pair at a time: the reference the batched code must equal.
            states, masks, embeds = [], [], []
            for text in texts:
                tok = tokenizer([text], return_tensors="pt")
                out = model.encode_text(tok["input_ids"], tok["attention_mask"])
                states.append(out.last_hidden_state)
                masks.append(tok["attention_mask"])
                embeds.append(out.text_embeds[0])
            embeds = torch.stack(embeds)
            dual = (embeds @ image_out.image_embeds.T).numpy()

            def match(q: int, i: int, states: list = states, masks: list = masks, dual=dual) -> float:
                """The re-ranking score written out: dual logit plus match log-odds."""
                logits = model.fuse(states[q], masks[q], image_out.image_tokens[i : i + 1]).itm_logits[0]
                return float(dual[q, i]) / temperature + float(logits[1] - logits[0])

            for q in range(n * c):
                order = list(np.argsort(-dual[q], kind="stable"))
                target = q // c
                rank = order.index(target)
                if rank < k:
                    short = sorted(order[:k], key=lambda i: -match(q, i))
                    rank = short.index(target)
                assert result.ir_reranked[q, li] == rank, (lang, q)
            for i in range(n):
                order = list(np.argsort(-dual[:, i], kind="stable"))
                targets = {i * c, i * c + 1}
                rank = min(order.index(t) for t in targets)
                if rank < k:
                    short = sorted(order[:k], key=lambda q: -match(q, i))
                    rank = min(short.index(t) for t in targets if t in short)
                assert result.tr_reranked[i, li] == rank, (lang, i)


def test_rerank_never_moves_targets_outside_the_shortlist(tiny_split) -> None:
    model, tokenizer, data, pre = tiny_split
    result = evaluate(model, tokenizer, data, pre, rerank_k=2)
    outside = result.ir_ranks >= 2
    assert (result.ir_reranked[outside] == result.ir_ranks[outside]).all()
    assert (result.ir_reranked[~outside] < 2).all()


def test_report_dump_and_table(tiny_split, tmp_path) -> None:
    model, tokenizer, data, pre = tiny_split
    result = evaluate(model, tokenizer, data, pre, rerank_k=2)
    report = result.report()
    assert report["languages"] == list(LANGS) and report["n_images"] == 6 and report["n_ir_queries"] == 24
    ir = report["dual"]["IR"]
    assert ir["recall"]["R@1"]["de"] == pytest.approx(recall_at_k(result.ir_ranks, 1)[1])
    assert ir["mrv"] == pytest.approx(mrv(result.ir_ranks))
    assert "reranked" in report
    dump = json.loads(json.dumps(result.rank_dump()))
    assert np.array_equal(np.array(dump["IR"]), result.ir_ranks)
    assert np.array_equal(np.array(dump["TR_reranked"]), result.tr_reranked)
    table = format_table(report)
    assert "re-ranked top 2" in table and "de" in table and "mrv_std" in table


def test_rerank_k_must_be_positive(tiny_split) -> None:
    model, tokenizer, data, pre = tiny_split
    with pytest.raises(ValueError, match="rerank_k"):
        evaluate(model, tokenizer, data, pre, rerank_k=0)


def test_evaluation_through_the_encoder_interface(tiny_split, tmp_path) -> None:
    """The serving runtimes evaluate to the torch model's ranks (exactly for torch, fp32 ONNX within
    float noise); int8 graphs evaluate too."""
    from model.evaluation import evaluate_encoder
    from model.export import export_onnx, quantize_int8
    from model.runtime import load_encoder

    model, tokenizer, data, pre = tiny_split
    model.save_pretrained(tmp_path, tokenizer)
    export_onnx(model, tmp_path)
    quantize_int8(tmp_path)
    reference = evaluate(model, tokenizer, data, pre, rerank_k=3)
    via_torch = evaluate_encoder(load_encoder(tmp_path, "torch", device="cpu"), data, rerank_k=3)
    for name in ("ir_ranks", "tr_ranks", "ir_reranked", "tr_reranked"):
        assert np.array_equal(getattr(via_torch, name), getattr(reference, name)), name
    via_onnx = evaluate_encoder(load_encoder(tmp_path, "onnx", device="cpu"), data, rerank_k=3)
    assert (via_onnx.ir_reranked == reference.ir_reranked).mean() > 0.9
    int8 = evaluate_encoder(load_encoder(tmp_path, "onnx", device="cpu", int8=True), data, rerank_k=3)
    assert int8.ir_ranks.shape == reference.ir_ranks.shape and int8.report()["reranked"]["IR"]["mrv"] >= 0
