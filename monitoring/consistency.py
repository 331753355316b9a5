"""The cross-language consistency report: one intent, several languages (``POST /v1/consistency`` and the
probe runs).

MRV and mrv_std come from ``model.metrics`` (numpy only; importing it loads no torch), applied to the
(items in the union, languages) table of 0-based ranks, an item missing from a list counting as ``top_k``.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from model.metrics import mrv, mrv_std


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float | None:
    """Kendall's tau-b of two rank vectors (ties allowed); None when either is constant."""
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(len(x), k=1)
    sx, sy = dx[upper], dy[upper]
    untied_x, untied_y = np.count_nonzero(sx), np.count_nonzero(sy)
    if untied_x == 0 or untied_y == 0:
        return None
    return float((sx * sy).sum() / np.sqrt(float(untied_x) * float(untied_y)))


def consistency_report(lists: dict[str, list[str]], top_k: int) -> dict[str, object]:
    """Per-item ranks and variance, MRV, mrv_std, mean overlap@k and per-pair Kendall tau.

    ``lists`` maps a language to its result ids, best first (at most ``top_k`` each). Kendall tau of a pair
    is computed over the union of that pair's two lists (items absent from both say nothing about it).
    """
    langs = list(lists)
    union = list(dict.fromkeys(item for lang in langs for item in lists[lang][:top_k]))
    position = {lang: {item: rank for rank, item in enumerate(lists[lang][:top_k])} for lang in langs}
    table = np.array([[position[lang].get(item, top_k) for lang in langs] for item in union], dtype=np.int64)
    table = table.reshape(len(union), len(langs))
    items = [
        {"id": item, "ranks": dict(zip(langs, map(int, row), strict=True)), "variance": float(row.var())}
        for item, row in zip(union, table, strict=True)
    ]
    pairs = []
    for i, j in combinations(range(len(langs)), 2):
        a, b = langs[i], langs[j]
        shared = set(position[a]) & set(position[b])
        in_pair = [n for n, item in enumerate(union) if item in position[a] or item in position[b]]
        tau = kendall_tau_b(table[in_pair, i], table[in_pair, j]) if len(in_pair) > 1 else None
        pairs.append({"a": a, "b": b, "overlap": len(shared) / top_k, "kendall_tau": tau})
    return {
        "items": items,
        "mrv": mrv(table) if len(union) else 0.0,
        "mrv_std": mrv_std(table) if len(union) else 0.0,
        "mean_overlap": float(np.mean([p["overlap"] for p in pairs])) if pairs else 1.0,
        "pairs": pairs,
    }
