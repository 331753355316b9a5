"""The mkdocs hook (``hooks:`` in mkdocs.yml) that adds the generated reference pages to every build.

Nothing is written into ``docs/``: the pages exist only in the build (``mkdocs serve`` would otherwise
rebuild in a loop on its own output). The repository root goes first on ``sys.path`` so that the pages
describe this checkout's code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from docs.gen.reference import generated_pages

    for rel, content in generated_pages().items():
        existing = files.get_file_from_path(rel)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, rel, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Generated tables inside written pages (``<!-- generated: NAME -->``, see ``MARKERS``)."""
    from docs.gen.reference import fill_markers

    return fill_markers(markdown)
