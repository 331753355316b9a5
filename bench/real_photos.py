"""The shared real photos and their class names as multilingual queries (benchmarks and tests only).

``../shared/data`` beside the checkout holds 1,000 photos, one per ImageNet-1k class
(``photos/nXXXXXXXX_label.JPEG``: the WordNet id orders the classes, the label is English), and the class
names in de, fr, es, ja and zh (``babel-imagenet/labels.{lang}.json``, BabelNet non-commercial licence: read
for measurements, never copied into the product). A query is a class name; its one right answer is that
class's photo, whose index id is the file name (the indexer's id for a folder: the relative path).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PHOTOS = SHARED_DATA / "photos"
BABEL = SHARED_DATA / "babel-imagenet"
BABEL_LANGUAGES = ("de", "fr", "es", "ja", "zh")


def missing_reason(data: Path = SHARED_DATA) -> str | None:
    """Why the real data cannot be used here (None when it can)."""
    photos, babel = data / "photos", data / "babel-imagenet"
    if not photos.is_dir() or len(list(photos.glob("*.JPEG"))) < 1000:
        return f"the 1,000 real photos are not in {photos}"
    missing = [lang for lang in BABEL_LANGUAGES if not (babel / f"labels.{lang}.json").is_file()]
    if missing:
        return f"class names in {', '.join(missing)} are not in {babel}"
    return None


@dataclass(frozen=True)
class RealQueries:
    """Per language, (class index, class name) pairs; ``photo_ids[c]`` is class c's photo."""

    photo_ids: tuple[str, ...]
    by_language: dict[str, list[tuple[int, str]]]

    def common_classes(self, languages: tuple[str, ...]) -> list[int]:
        """Classes named in every one of ``languages`` (where MRV can compare ranks)."""
        sets = [{c for c, _ in self.by_language[lang]} for lang in languages]
        return sorted(set.intersection(*sets))

    def probe_lines(self, languages: tuple[str, ...]) -> list[str]:
        """A probe set (``monitoring.probe_set`` format) over the classes named in every language."""
        names = {lang: dict(self.by_language[lang]) for lang in languages}
        return [
            json.dumps(
                {
                    "id": f"class-{c}",
                    "target_ids": [self.photo_ids[c]],
                    "queries": {lang: names[lang][c] for lang in languages},
                },
                ensure_ascii=False,
            )
            for c in self.common_classes(languages)
        ]


def load_real_queries(data: Path = SHARED_DATA) -> RealQueries:
    """English names from the photo file names, the other languages from Babel-ImageNet."""
    photos = sorted((data / "photos").glob("*.JPEG"))
    ids = tuple(p.name for p in photos)
    english = [(c, p.stem.split("_", 1)[1].replace("_", " ")) for c, p in enumerate(photos)]
    by_language = {"en": english}
    for lang in BABEL_LANGUAGES:
        labels = json.loads((data / "babel-imagenet" / f"labels.{lang}.json").read_text("utf-8"))["labels"]
        by_language[lang] = sorted((int(c), name) for c, name in labels.items())
    return RealQueries(ids, by_language)
