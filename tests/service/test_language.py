"""The query language detector against a reference written with py3langid's public ``rank()``: the same
label, support flag, mixed flag and confidence on whole and shortened catalogue captions in the model's ten
languages, on unsupported languages, on mixed and on letterless queries."""

from __future__ import annotations

import pytest

from model.configs import get_preset
from model.data.synth import SynthConfig, iter_items
from service.language import RELATIVES, UNSUPPORTED_MIN_P, LanguageDetector
from service.schemas import LanguageInfo


def reference_detect(detector: LanguageDetector, text: str) -> LanguageInfo:
    """The rule of ``LanguageDetector.detect`` over the sorted (code, p) list of ``rank()``."""
    if not any(char.isalpha() for char in text):
        return LanguageInfo(code="und", confidence=0.0, source="detected", supported=False)
    supported = detector.supported
    ranked = detector._full.rank(text)
    supported_mass = sum(p for c, p in ranked if RELATIVES.get(c, c) in supported)
    top_code, top_p = next(((c, p) for c, p in ranked if RELATIVES.get(c, c) not in supported), ranked[0])
    mixed = detector._mixed(text)
    if top_code not in supported and top_p >= UNSUPPORTED_MIN_P and top_p > supported_mass:
        return LanguageInfo(
            code=top_code, confidence=round(top_p, 4), source="detected", supported=False, mixed=mixed
        )
    strict = [(c, p) for c, p in ranked if c in supported]
    code, p = strict[0]
    p = p / max(sum(q for _, q in strict), 1e-12)
    return LanguageInfo(
        code=code, confidence=round(float(p), 4), source="detected", supported=True, mixed=mixed
    )


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(get_preset("demo").languages)  # the shipped model's ten


def queries() -> list[str]:
    texts = []
    for item in iter_items("test", SynthConfig(seed=11, n_train=0, n_val=0, n_test=30)):
        for captions in item.captions.values():
            words = captions[0].split()
            texts += [captions[0], " ".join(words[:2]), " ".join(words[:3])]
    return [
        *texts,
        "czerwony kubek w paski",  # Polish
        "빨간 줄무늬 머그컵",  # Korean
        "κόκκινη κούπα με ρίγες",  # Greek
        "roter Becher red striped mug",  # mixed halves
        "赤い mug",  # mixed scripts
        "12345 !!",  # no letters
        "HAT",
        "x",
    ]


def test_detect_equals_the_rank_reference(detector: LanguageDetector) -> None:
    texts = queries()
    assert len(texts) > 900
    labels = set()
    for text in texts:
        got, want = detector.detect(text), reference_detect(detector, text)
        assert (got.code, got.supported, got.mixed, got.source) == (
            want.code,
            want.supported,
            want.mixed,
            want.source,
        ), text
        assert got.confidence == pytest.approx(want.confidence, abs=1e-4), text
        labels.add(got.code)
    # The cases above exercise every branch: supported labels, an unsupported one, "und".
    assert {"pl", "und"} <= labels and len(labels & set(detector.supported)) == 10
