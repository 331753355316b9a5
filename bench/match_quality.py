"""Match quality labels (strong / weak / none) measured on held-out queries, for the demo model on its
synthetic catalogue and for the starter model on the shared real photos.

    python bench/match_quality.py --out bench/results/match_quality-DATE.json

Each index is built by the indexer (which calibrates it: ``indexer.match_calibration``); then queries the
calibration never saw are labelled as the service labels them (``service.matching.MatchJudge``):
- in-domain: the demo catalogue's *second* caption of each item (calibration reads the first), short
  queries written for this bench; for the starter, the class names of the real photos (en from the file
  names, de/fr/es/ja/zh from Babel-ImageNet; that index has no captions, so it is calibrated on noise only);
- no match: a list written for this bench (other domains, scripts the model does not know, code, mashes)
  and random strings of another seed than the calibration's.
"No match" precision and recall treat ``none`` as the prediction "nothing here matches": recall is the
share of no-match queries labelled none, precision the share of none labels that fall on no-match queries.
Prints a JSON document, then a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_photos import PHOTOS, load_real_queries, missing_reason  # noqa: E402
from ccrk_settings import DEFAULT_MODEL_DIR, Settings  # noqa: E402
from indexer.build import build  # noqa: E402
from indexer.ood_queries import ood_queries  # noqa: E402
from model.runtime import load_encoder  # noqa: E402
from service.index_holder import Served  # noqa: E402
from service.language import LanguageDetector  # noqa: E402
from service.matching import MatchJudge  # noqa: E402
from service.schemas import SearchHit  # noqa: E402
from store.version.reader import IndexVersion  # noqa: E402

NO_MATCH = (
    "iPhone 15 case",
    "wireless headphones",
    "gaming laptop 16GB RAM",
    "asdfgh",
    "...",
    "a",
    "SELECT name FROM products WHERE 1=1",
    "how do I reset my password",
    "best pizza near me",
    "stock price of apple",
    "Kündigungsfrist Mietvertrag",
    "horaires d'ouverture de la mairie",
    "cómo llegar al aeropuerto",
    "расписание электричек",
    "東京の天気",
    "北京到上海的火车",
    "무선 헤드폰",
    "스마트폰 케이스",
    "سماعات لاسلكية",
    "हिंदी समाचार",
    "Η Ελλάδα",
    "שלום עולם",
    "สวัสดีครับ",
)
# Short in-domain queries for the demo catalogue (its products, colours and counts).
SHORT = {
    "en": ["red mug", "blue hats", "three yellow umbrellas", "green bag", "striped socks"],
    "de": ["rote Tasse", "blaue Hüte", "drei gelbe Regenschirme", "grüne Tasche", "gestreifte Socken"],
    "fr": ["tasse rouge", "chapeaux bleus", "trois parapluies jaunes", "sac vert"],
    "ja": ["赤いカップ", "黄色い傘が三本", "青い帽子", "緑のかばん"],
    "zh": ["红色杯子", "三把黄色雨伞", "蓝色帽子", "绿色包"],
    "es": ["taza roja", "sombreros azules", "tres paraguas amarillos"],
    "ru": ["красная кружка", "синие шляпы", "три жёлтых зонта"],
    "cs": ["červený hrnek", "modré klobouky", "tři žluté deštníky"],
    "tr": ["kırmızı kupa", "mavi şapkalar", "üç sarı şemsiye"],
    "id": ["mug merah", "topi biru", "tiga payung kuning"],
}


def labeller(index: IndexVersion, encoder: object, languages: tuple[str, ...]) -> tuple:
    judge = MatchJudge(encoder)  # type: ignore[arg-type]
    served = Served(index)
    detector = LanguageDetector(languages)
    costs: list[float] = []

    def label(text: str, lang: str | None = None) -> str:
        info = detector.resolve(text, lang)
        embeds = encoder.encode_text([text]).embeds  # type: ignore[attr-defined]
        scores, rows = index.search(embeds, 20)
        hits = [
            SearchHit(id=str(r), score=float(s), rank=i, metadata={}, image_url="")
            for i, (s, r) in enumerate(zip(scores[0], rows[0], strict=True))
        ]
        start = time.perf_counter()
        judged = judge.judge(served, info.code if info.supported else None, hits, float(scores[0][0]), "auto")
        costs.append((time.perf_counter() - start) * 1000.0)
        return judged.label or "none"

    return label, costs


def rates(labels: list[str]) -> dict[str, float]:
    counts = Counter(labels)
    return {k: round(counts[k] / len(labels), 4) for k in ("strong", "weak", "none")} | {"n": len(labels)}


def no_match_scores(in_domain: list[str], no_match: list[str]) -> dict[str, float]:
    true_none = sum(x == "none" for x in no_match)
    false_none = sum(x == "none" for x in in_domain)
    return {
        "none_recall": round(true_none / len(no_match), 4),
        "none_precision": round(true_none / (true_none + false_none), 4) if true_none + false_none else 1.0,
        "in_domain_none_rate": round(false_none / len(in_domain), 4),
    }


def held_out_noise() -> list[str]:
    return list(NO_MATCH) + [t for k, t in ood_queries(n_random=80, seed=12345) if k.startswith("random")]


def demo(tmp: Path) -> dict:
    from synthetic.catalogue import load_split
    from synthetic.synth import SynthConfig, generate_catalogue

    generate_catalogue(tmp / "demo", SynthConfig(seed=0, n_train=0, n_val=0, n_test=1000), workers=2)
    settings = Settings(model_dir=DEFAULT_MODEL_DIR, index_root=tmp / "idx", threads=2, index_workers=1)
    started = time.perf_counter()
    report = build("demo", [tmp / "demo" / "test.jsonl"], settings=settings)
    records = load_split(tmp / "demo" / "test.jsonl")
    encoder = load_encoder(DEFAULT_MODEL_DIR, threads=1)
    with IndexVersion.open(settings.index_root, "demo") as index:
        label, costs = labeller(index, encoder, tuple(encoder.config.languages))
        rng = np.random.default_rng(7)
        picks = rng.choice(len(records), 60, replace=False)
        per_language = {}
        all_in: list[str] = []
        for lang in encoder.config.languages:
            captions = [label(records[i].captions[lang][1]) for i in picks]
            short = [label(q) for q in SHORT.get(lang, [])]
            all_in += captions + short
            per_language[lang] = {"captions": rates(captions), "short": rates(short)}
        noise = [label(q) for q in held_out_noise()]
        calibration = index.manifest.match_calibration
    return {
        "items": report.items_indexed,
        "build_seconds": round(time.perf_counter() - started, 1),
        "calibration": calibration,
        "per_language": per_language,
        "no_match": rates(noise),
        **no_match_scores(all_in, noise),
        "label_cost_ms_p50": round(float(np.median(costs)), 4),
    }


def starter(tmp: Path) -> dict:
    from model.starter.build import build_starter

    model = build_starter(tmp / "starter").out
    settings = Settings(model_dir=model, index_root=tmp / "idx-photos", threads=2, index_workers=1)
    build("photos", [PHOTOS], settings=settings)
    encoder = load_encoder(model, threads=1)
    queries = load_real_queries()
    with IndexVersion.open(settings.index_root, "photos") as index:
        label, costs = labeller(index, encoder, tuple(encoder.config.languages))
        rng = np.random.default_rng(7)
        per_language = {}
        all_in: list[str] = []
        for lang, pairs in queries.by_language.items():
            picked = [pairs[i][1] for i in rng.choice(len(pairs), 150, replace=False)]
            labels = [label(q) for q in picked]
            all_in += labels
            per_language[lang] = {"class_names": rates(labels)}
        noise = [label(q) for q in held_out_noise()]
        calibration = index.manifest.match_calibration
    return {
        "calibration": calibration,
        "per_language": per_language,
        "no_match": rates(noise),
        **no_match_scores(all_in, noise),
        "label_cost_ms_p50": round(float(np.median(costs)), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-starter", action="store_true")
    args = parser.parse_args()
    result: dict = {"benchmark": "match_quality"}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        result["demo"] = demo(tmp)
        reason = missing_reason()
        if args.skip_starter or reason:
            result["starter"] = {"skipped": reason or "--skip-starter"}
        else:
            result["starter"] = starter(tmp)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    for name in ("demo", "starter"):
        part = result[name]
        if "skipped" in part:
            continue
        print(f"\n== {name}: strong / weak / none shares of held-out queries ==")
        print(f"{'lang':<6}{'set':<12}{'n':>5}{'strong':>8}{'weak':>8}{'none':>8}")
        for lang, sets in part["per_language"].items():
            for set_name, r in sets.items():
                row = (
                    f"{lang:<6}{set_name:<12}{r['n']:>5}{r['strong']:>8.2f}{r['weak']:>8.2f}{r['none']:>8.2f}"
                )
                print(row)
        r = part["no_match"]
        print(f"{'any':<6}{'no-match':<12}{r['n']:>5}{r['strong']:>8.2f}{r['weak']:>8.2f}{r['none']:>8.2f}")
        print(
            f"no-match precision {part['none_precision']:.3f}, recall {part['none_recall']:.3f}; "
            f"labelling {part['label_cost_ms_p50']} ms per query"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
