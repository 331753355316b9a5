import numpy as np
import pytest
import torch

from model.reranking import MATCH_OUTPUT, RERANK_SCORES, rerank_order, rerank_scores


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


# -- the paper's score: the match logit alone ---------------------------------------------------------------


def test_itm_logit_ranks_by_the_match_logit_alone() -> None:
    sims = np.array([0.9, 0.1, 0.5], dtype=np.float32)
    logit1 = np.array([-1.0, 2.0, 2.0], dtype=np.float32)
    assert rerank_scores(sims, logit1, 0.05, "itm_logit") is logit1
    # Ties (candidates 1 and 2) keep the shortlist's dual order; the dual similarity plays no part.
    assert rerank_order(sims, logit1, 0.05, "itm_logit").tolist() == [1, 2, 0]
    assert rerank_order(sims, logit1, 0.05).tolist() == [0, 2, 1]  # the default: 17, 4, 12
    assert rerank_order(sims, logit1, 0.0, "itm_logit").tolist() == [1, 2, 0]  # no temperature needed
    assert MATCH_OUTPUT == {"dual_plus_margin": "match_logit", "itm_logit": "match_logit1"}
    assert RERANK_SCORES == ("dual_plus_margin", "itm_logit")
    with pytest.raises(ValueError, match="dual_plus_margin, itm_logit"):
        rerank_scores(sims, logit1, 0.05, "itm")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_model_and_split():
    from model.modeling import CCRkModel
    from model.preprocessing import ImagePreprocessor
    from model.tokenization import train_tokenizer
    from model.training_data import CaptionedImages
    from tests.tiny import tiny_config

    torch.manual_seed(0)
    model = CCRkModel(tiny_config(vocab_size=300)).eval()
    colours, things = ["red", "blue", "green"], ["mug", "hat"]
    captions = [
        {"en": [f"{colours[i % 3]} {things[i // 3]}", f"a {colours[i % 3]} {things[i // 3]}"]}
        for i in range(6)
    ]
    tokenizer = train_tokenizer([t for c in captions for t in c["en"]] * 3, 300, 32)
    pixels = torch.randint(
        0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    data = CaptionedImages(
        ids=[f"i{i}" for i in range(6)],
        pixels=pixels,
        captions=captions,
        languages=("en",),
        item_keys=[f"i{i}" for i in range(6)],
    )
    return model, tokenizer, data, ImagePreprocessor(model.config.vision)


def test_evaluate_with_the_paper_score_matches_a_pairwise_reference(tiny_model_and_split, tmp_path) -> None:
    from model.evaluation import evaluate, evaluate_encoder
    from model.export import export_onnx
    from model.runtime import EncoderError, load_encoder

    model, tokenizer, data, pre = tiny_model_and_split
    k = 4
    paper = evaluate(model, tokenizer, data, pre, rerank_k=k, rerank_score="itm_logit")
    ours = evaluate(model, tokenizer, data, pre, rerank_k=k)
    assert (
        paper.report()["rerank_score"] == "itm_logit" and ours.report()["rerank_score"] == "dual_plus_margin"
    )
    with torch.no_grad():
        images = model.encode_image(pre.normalize(data.pixels))
        texts = [c for caption in data.captions for c in caption["en"]]
        for q, text in enumerate(texts):
            tok = tokenizer([text], return_tensors="pt")
            out = model.encode_text(tok["input_ids"], tok["attention_mask"])
            dual = (out.text_embeds @ images.image_embeds.T)[0].numpy()
            order = list(np.argsort(-dual, kind="stable"))
            rank = order.index(q // 2)
            if rank < k:
                logit1 = {
                    i: float(
                        model.fuse(
                            out.last_hidden_state, tok["attention_mask"], images.image_tokens[i : i + 1]
                        ).itm_logits[0, 1]
                    )
                    for i in order[:k]
                }
                rank = sorted(order[:k], key=lambda i: -logit1[i]).index(q // 2)
            assert paper.ir_reranked[q, 0] == rank, q
    # On this untrained model the two scores disagree somewhere, so the option is really used.
    assert not np.array_equal(paper.ir_reranked, ours.ir_reranked) or not np.array_equal(
        paper.tr_reranked, ours.tr_reranked
    )
    # The serving interface (ONNX Runtime) ranks the same with the paper's score.
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir, tokenizer)
    export_onnx(model, model_dir)
    served = evaluate_encoder(load_encoder(model_dir, "onnx", threads=1), data, k, rerank_score="itm_logit")
    np.testing.assert_array_equal(served.ir_reranked, paper.ir_reranked)
    np.testing.assert_array_equal(served.tr_reranked, paper.tr_reranked)
    # An export without the match logit (made before this score existed) says what to do.
    old = tmp_path / "old-export"
    model.save_pretrained(old, tokenizer)
    export_onnx(model, old, match_logit1=False)
    with pytest.raises(EncoderError, match="re-run `ccrk export onnx`"):
        evaluate_encoder(load_encoder(old, "onnx", threads=1), data, k, rerank_score="itm_logit")


def test_fusion_graph_second_output(tiny_model_and_split, tmp_path) -> None:
    import json

    import onnxruntime as ort

    from model.export import export_onnx

    model = tiny_model_and_split[0]
    default, paper = tmp_path / "default", tmp_path / "paper"
    export_onnx(model, default, match_logit1=False)
    export_onnx(model, paper)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 300, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[2, 4:] = 0
    with torch.no_grad():
        states = model.encode_text(ids, mask).last_hidden_state
        tokens = model.encode_image(torch.randn(3, 3, 32, 32, generator=gen)).image_tokens
        logits = model.fuse(states, mask, tokens).itm_logits.numpy()
    feeds = {"text_states": states.numpy(), "attention_mask": mask.numpy(), "image_tokens": tokens.numpy()}
    outputs = {}
    for name, folder in (("default", default), ("paper", paper)):
        session = ort.InferenceSession(
            str(folder / "onnx" / "fusion_scorer.onnx"), providers=["CPUExecutionProvider"]
        )
        manifest = json.loads((folder / "onnx" / "export.json").read_text(encoding="utf-8"))
        assert [o.name for o in session.get_outputs()] == manifest["fusion_outputs"]
        outputs[name] = dict(zip(manifest["fusion_outputs"], session.run(None, feeds), strict=True))
    assert list(outputs["default"]) == ["match_logit"]
    assert list(outputs["paper"]) == ["match_logit", "match_logit1"]  # the margin stays the first output
    np.testing.assert_allclose(outputs["paper"]["match_logit"], outputs["default"]["match_logit"], atol=1e-6)
    np.testing.assert_allclose(outputs["paper"]["match_logit"], logits[:, 1] - logits[:, 0], atol=1e-4)
    np.testing.assert_allclose(outputs["paper"]["match_logit1"], logits[:, 1], atol=1e-4)
