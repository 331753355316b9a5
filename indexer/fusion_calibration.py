"""Calibrating the hybrid fusion of a version from the collection itself (no hand-set weight, no labelled
queries): pseudo-queries drawn from the shop's own text, fusion methods compared by cross-validation over
them, the winner fitted and stored in the version (``store.products.hybrid.FusionModel``).

Pseudo-queries: a fragment of 1-3 consecutive words of one text value (a product-type or attribute query
is a few words of what some products' titles or descriptions say). Its relevant products are those whose
same field holds every one of the fragment's terms. That field is hidden from the text channels (the
issue's "a product's field as the query for its other fields": relevance was defined by it, so finding it
there would be too easy; a catalogue with one text field hides only the value the fragment was cut from),
and queries relevant to more than a fifth of the catalogue are dropped (too generic to rank). Each is asked
twice:

- as written (group = its language): the lexical channel sees every other text value;
- as a foreign query (group ``other``): the lexical channel sees only values in other languages, which is
  what a query in a language the shop never wrote in meets (matches on brands and shared words only).
  Where the shop writes in one language only, nothing simulates how a foreign query meets its text (every
  pseudo-query reads it in its own language), so the ``other`` group ranks by the photos alone: with the
  text channels fitted on same-language pseudo-queries, the demo catalogue's German titles got the weight
  of its photos for queries in its nine other languages, and hybrid R@1 fell to 0.41 there against 0.80 for
  the photos alone.

Methods: reciprocal-rank fusion (nothing fitted), a weighted sum of standardised features (weights on a
grid over the simplex, best training R-precision) and logistic regression (L2, per group). Each language
group with enough queries gets its own parameters. The method is chosen by 5-fold cross-validation over the
pseudo-queries (``cross_validated``): the simplest one whose out-of-fold R-precision is within one standard
error of the best one's (``choose_method``). The chosen method's parameters and labels are then fitted on
70 % of each group's queries, the rest held out for the report. A channel that does not help (its feature
tells relevant from irrelevant candidates no better than chance) ends up with a weight near zero in the
fitted methods.

Match labels: per group, a small match model (logistic on the raw image, text and lexical features of a
candidate) is fitted to tell pseudo-queries' matches from what queries that match nothing meet, and
``none_below`` on its probability separates the match probability of a pseudo-query's best relevant
candidate (in the catalogue) from that of queries that match nothing: a pseudo-query's best candidate once
its relevant products are removed (the hard side: a product type the shop does not sell, next to ones it
does) and the best candidate of queries from other domains (``indexer.ood_queries``, the easy side), by the
largest sum of both rates, each smoothed by a kernel (``indexer.fusion_fitting._cut``); ``strong_from`` is
the median probability of the matches above it. "Best": the one the match model scores highest, as a
query's label reads its best candidate (``indexer.fusion_fitting.fit_match``, refitted from the
top-fused ones).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from indexer.fusion_fitting import (
    FIT_MATCH_FEATURES,
    Sample,
    evaluate,
    fit,
    fit_match,
    r_precisions,
    thresholds,
)
from indexer.ood_queries import ood_queries
from model.runtime import Encoder
from store.products.channels import ProductChannels, TextRows
from store.products.hybrid import (
    CANDIDATES,
    OTHER,
    Candidates,
    FusionModel,
    GroupParams,
    HybridQuery,
    gather,
)
from store.text.lexical import analyze

# The calibration code's version, recorded with a fit (``ProductInfo.calibration_code``): a rebuild takes a
# parent's calibration over only when it was fitted by the same code. 1: match models with non-negative
# weights (27 Nov 2026, session 14); 2: the method chosen by cross-validation, the label cut smoothed
# (session 15); 3: a match feature every calibration match holds at its maximum left out of the match model
# (session 19); 4: the term coverage over every value of a product in place of its best BM25 value's (2 Dec
# 2026, issue 45). Bump it with any change to what calibrate() fits.
CALIBRATION_CODE = 4
MAX_QUERIES = 600
HELD_OUT = 0.3
FOLDS = 5
MIN_GROUP_QUERIES = 40
GENERIC_SHARE = 0.2
SEED = 20241
WORD_KINDS = ("other-domain", "fragment")
METHODS = ("rrf", "weighted", "logistic")
_PUNCT = re.compile(r"^\W+|\W+$")


@dataclass
class PseudoQuery:
    text: str
    lang: str
    source_row: int  # the text row it was cut from (hidden from the text channels)
    relevant: frozenset[int]


@dataclass
class Calibration:
    model: FusionModel
    report: dict[str, Any] = field(default_factory=dict)


def catalogue_languages(counts: dict[str, int]) -> list[str]:
    """The languages the shop writes in: at least 20 values and 5 % of them (identification noise on short
    values is not a language of the catalogue)."""
    total = sum(counts.values())
    return sorted(
        lang for lang, n in counts.items() if lang != "und" and n >= 20 and n >= 0.05 * max(total, 1)
    )


def pseudo_queries(
    texts: TextRows, products: int, rng: np.random.Generator, catalogue_order: np.ndarray | None = None
) -> list[PseudoQuery]:
    """Fragments of the text values (see the module docstring), at most ``MAX_QUERIES``. The values are
    drawn in a random order of the catalogue's order: ``catalogue_order`` (the text row of each value in the
    catalogue's order; default the text rows' own), so that a version holding the same values in another
    order of rows (a sharded one) draws the same pseudo-queries."""
    by_field: dict[tuple[str, str], set[int]] = defaultdict(set)  # (field, term) -> owners
    for owner, fname, terms in zip(texts.owners.tolist(), texts.fields, texts.terms, strict=True):
        for term in terms:
            by_field[(fname, term)].add(owner)
    order = rng.permutation(len(texts.texts))
    if catalogue_order is not None:
        order = np.asarray(catalogue_order, np.int64)[order]
    queries: list[PseudoQuery] = []
    seen: set[tuple[str, str]] = set()
    limit = max(2, int(GENERIC_SHARE * products))
    for row in order.tolist():
        words = [w for w in (_PUNCT.sub("", w) for w in texts.texts[row].split()) if w]
        if not words:
            continue
        length = int(rng.choice([1, 2, 3], p=[0.4, 0.4, 0.2]))
        start = int(rng.integers(0, max(1, len(words) - length + 1)))
        fragment = " ".join(words[start : start + length])
        lang, fname = texts.langs[row], texts.fields[row]
        terms = analyze(fragment, lang)
        if not terms or all(t.isdigit() or len(t) < 2 for t in terms) or (fname, fragment) in seen:
            continue
        seen.add((fname, fragment))
        relevant = set.intersection(*(by_field.get((fname, t), set()) for t in terms))
        if not relevant or len(relevant) > limit:
            continue
        queries.append(PseudoQuery(fragment, lang, row, frozenset(relevant)))
        if len(queries) >= MAX_QUERIES:
            break
    return queries


def ask(
    channels: ProductChannels,
    texts: TextRows,
    queries: Sequence[PseudoQuery],
    embeds: np.ndarray,
    allowed: np.ndarray | None,
) -> list[Sample]:
    """Each pseudo-query asked as written and as a foreign query."""
    langs = np.asarray(texts.langs)
    fields = np.asarray(texts.fields)
    several = len(set(texts.fields)) > 1
    samples: list[Sample] = []
    for query, embed in zip(queries, embeds, strict=True):
        if several:  # the query's field hidden from every product: found through the other fields only
            hidden = fields != fields[query.source_row]
        else:
            hidden = np.ones(len(texts.texts), bool)
            hidden[query.source_row] = False
        terms = analyze(query.text, query.lang)
        for group, lex_mask in ((query.lang, hidden), (OTHER, hidden & (langs != query.lang))):
            cands = gather(
                channels,
                HybridQuery(embed, terms, group),
                CANDIDATES,
                allowed,
                text_mask=hidden,
                lexical_mask=lex_mask,
            )
            labels = np.isin(cands.rows, np.fromiter(query.relevant, np.int64))
            samples.append(Sample(group, cands, labels, len(query.relevant)))
    return samples


def other_domain(channels: ProductChannels, encoder: Encoder, allowed: np.ndarray | None) -> list[Candidates]:
    """The candidates of queries that match nothing in any shop (``indexer.ood_queries``: other-domain
    phrases in many languages, markup and code fragments): the easy side of "no match", beside the
    pseudo-queries' hard side (their best irrelevant product). Keyboard mashes, symbol runs and random
    letters are left out: queries without words are no-match in a trivial way that says nothing about where
    a word query for something the shop does not sell falls (with them, 66 % of such queries on the shared
    grocery catalogue were labelled as matches)."""
    texts = [t for kind, t in ood_queries(n_random=0, seed=SEED) if kind.startswith(WORD_KINDS)]
    embeds = encoder.encode_text(texts).embeds
    return [
        gather(channels, HybridQuery(e, analyze(t, None)), CANDIDATES, allowed)
        for t, e in zip(texts, embeds, strict=True)
    ]


def calibrate(
    channels: ProductChannels,
    texts: TextRows,
    encoder: Encoder,
    languages: dict[str, int],
    products: int,
    allowed: np.ndarray | None = None,
    *,
    catalogue_order: np.ndarray | None = None,
) -> Calibration:
    """Fit, compare and choose the fusion of a staged version (see the module docstring; ``catalogue_order``
    as for ``pseudo_queries``)."""
    rng = np.random.default_rng(SEED)
    catalogue = catalogue_languages(languages)
    queries = pseudo_queries(texts, products, rng, catalogue_order)
    if len(queries) < 10:  # too little text to calibrate on: reciprocal rank, no fused match labels
        return Calibration(
            FusionModel.reciprocal_rank(catalogue), {"pseudo_queries": len(queries), "method": "rrf"}
        )
    acquired = set(encoder.acquired_languages)
    embeds = np.zeros((len(queries), encoder.config.embed_dim), np.float32)
    for lo in range(0, len(queries), 64):
        batch = queries[lo : lo + 64]
        langs = [q.lang if q.lang in acquired else None for q in batch]
        embeds[lo : lo + len(batch)] = encoder.encode_text(
            [q.text for q in batch], langs if any(langs) else None
        ).embeds
    samples = ask(channels, texts, queries, embeds, allowed)
    no_match = other_domain(channels, encoder, allowed)
    held = rng.random(len(samples)) < HELD_OUT
    # Folds by pseudo-query: both askings of a query (``ask``: two per query, in order) in the same fold.
    assert len(samples) == 2 * len(queries)  # ``ask``: two askings per query, in order
    fold = (rng.permutation(len(queries)) % FOLDS)[np.arange(len(samples)) // 2]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group if s.group in catalogue or s.group == OTHER else "_same"].append(i)
    same = [i for i, s in enumerate(samples) if s.group != OTHER]
    report: dict[str, Any] = {"pseudo_queries": len(queries), "groups": {}, "held_out": {}}
    members = {
        group: same if len(groups.get(group, [])) < MIN_GROUP_QUERIES and group != OTHER else groups[group]
        for group in [*catalogue, OTHER]
    }  # a group with too few queries of its own: the pooled same-language queries
    # Each group's own samples, scored under the parameters its queries are ranked by (a small group's are
    # fitted on the pooled ones): every sample once, whatever the pooling.
    own = {group: groups.get(group, []) for group in members}
    out_of_fold = {method: cross_validated(method, samples, members, own, fold) for method in METHODS}
    report["cross_validated"] = {
        m: round(float(np.nanmean(v)), 4) if np.isfinite(v).any() else 0.0 for m, v in out_of_fold.items()
    }
    best_method = choose_method(out_of_fold, np.arange(len(samples)) // 2)
    fitted: dict[str, dict[str, dict[str, GroupParams]]] = {}
    for method in METHODS:
        per_mode: dict[str, dict[str, GroupParams]] = {}
        scores = []
        for mode in ("hybrid", "text"):
            table: dict[str, GroupParams] = {}
            for group in [*catalogue, OTHER]:
                idx = members[group]
                train = [samples[i] for i in idx if not held[i]]
                test = [samples[i] for i in idx if held[i]]
                if not train:
                    continue
                params = fit(method, train, mode)
                fit_match(method, params, train, mode, no_match)
                table[group] = params
                if mode == "hybrid":
                    scores.append((evaluate(method, params, test, mode), len(test)))
                    report["held_out"].setdefault(method, {})[group] = round(scores[-1][0], 4)
            per_mode[mode] = table
        fitted[method] = per_mode
        report.setdefault("fitted", {})[method] = {
            mode: {g: p.to_dict() for g, p in table.items()} for mode, table in per_mode.items()
        }
        total = sum(n for _, n in scores) or 1
        report["held_out"].setdefault(method, {})["mean"] = round(sum(s * n for s, n in scores) / total, 4)
    chosen = fitted[best_method]
    if OTHER not in chosen["hybrid"]:
        return Calibration(FusionModel.reciprocal_rank(catalogue), {**report, "method": "rrf"})
    written = {lang for lang in texts.langs if lang != "und"}
    if len(written) <= 1 and best_method != "rrf":
        # One language written: a foreign query's match to the shop's text cannot be simulated (every
        # pseudo-query reads the text in its own language, which a foreign query never does), so nothing
        # shows the text channels help it; its products are ranked by their photos, which no language binds.
        params = chosen["hybrid"][OTHER]
        chosen["hybrid"][OTHER] = GroupParams(
            weights=[1.0 if name == "image" else 0.0 for name in params.features],
            mean=params.mean,
            std=params.std,
            features=params.features,
            match_features=list(FIT_MATCH_FEATURES),  # fit_match decides anew which to leave out
            match_over=params.match_over,
        )
        train = [samples[i] for i in groups.get(OTHER, []) if not held[i]]
        fit_match(best_method, chosen["hybrid"][OTHER], train, "hybrid", no_match)
        report["other_group"] = "photos only: the shop's text is in one language"
    model = FusionModel(best_method, chosen["hybrid"], chosen["text"], catalogue)
    for group in chosen["hybrid"]:
        idx = groups.get(group, same)
        test = [samples[i] for i in idx if held[i]] or [samples[i] for i in idx]
        report["groups"][group] = {
            "queries": len(idx),
            **thresholds(best_method, chosen["hybrid"][group], test, "hybrid", no_match),
        }
    report["method"] = best_method
    return Calibration(model, report)


def cross_validated(
    method: str,
    samples: Sequence[Sample],
    members: dict[str, list[int]],
    own: dict[str, list[int]],
    fold: np.ndarray,
) -> np.ndarray:
    """Out-of-fold R-precision of every sample under ``method`` (hybrid mode), NaN where none was taken:
    each group's own samples (``own``) of a fold ranked by the parameters fitted on its ``members`` in the
    other folds."""
    scores = np.full(len(samples), np.nan)
    for group, idx in members.items():
        for k in range(FOLDS):
            train = [samples[i] for i in idx if fold[i] != k]
            test = [i for i in own[group] if fold[i] == k]
            if train and test:
                got = r_precisions(method, fit(method, train, "hybrid"), [samples[i] for i in test], "hybrid")
                scores[test] = got
    return scores


def choose_method(out_of_fold: dict[str, np.ndarray], query_of: np.ndarray) -> str:
    """The simplest method (in ``METHODS`` order: nothing fitted, a few non-negative weights, a free linear
    model) whose out-of-fold R-precision is within one standard error of the best one's: the error of their
    paired difference, summed per pseudo-query (``query_of``: its two askings are not independent), over
    the samples both scored (the one-standard-error rule). A method ahead by less than the draw's noise is
    not chosen over a simpler one. One 70/30 split chose by noise: on the shared grocery catalogue the method
    changed with the draw of pseudo-queries, and logistic fusion, chosen in 3 of 8 draws, ranked real
    queries worse (R-precision 0.635-0.682 against 0.679-0.706)."""
    scored = {m: v for m, v in out_of_fold.items() if np.isfinite(v).any()}
    if not scored:
        return "rrf"
    means = {m: float(np.nanmean(v)) for m, v in scored.items()}
    best = max(means, key=lambda m: means[m])
    for method in METHODS:
        if method not in means:
            continue
        both = np.isfinite(scored[best]) & np.isfinite(scored[method])
        # the mean difference over N samples is (Q / N) x the mean of Q per-query sums
        sums = np.bincount(query_of[both], weights=(scored[best] - scored[method])[both])
        sums = sums[np.bincount(query_of[both]) > 0]
        error = (
            float(sums.std(ddof=1) / np.sqrt(len(sums)) * len(sums) / both.sum()) if len(sums) > 1 else 0.0
        )
        if means[method] >= means[best] - error:
            return method
    return best
