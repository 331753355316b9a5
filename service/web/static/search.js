// The search page: /v1/search for one query, or two side by side (compare mode) with shared items marked.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const results = $("results");
  const errorBox = $("error");

  $("compare").addEventListener("change", function () {
    $("compare-row").hidden = !this.checked;
    $("query-b").required = this.checked;
  });

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function search(query, lang) {
    const body = { query: query, top_k: Number($("top-k").value) || 24, rerank: $("rerank").checked };
    if (lang) body.lang = lang;
    const mode = $("mode") ? $("mode").value : "";
    if (mode) body.mode = mode;
    // Products (an index with text fields): say why each product matched.
    if ($("mode") && mode !== "image") body.explain = true;
    const response = await fetch("/v1/search", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await response.json();
    if (!response.ok) {
      const detail = (data.detail || []).map((d) => (d.loc || []).join(".") + ": " + d.msg).join("; ");
      throw new Error(detail || response.statusText);
    }
    return data;
  }

  function panel(side, query, data) {
    const section = el("section", { class: "panel", "data-side": side });
    const lang = data.language;
    const meta = el("div", { class: "meta" });
    meta.append(el("q", { class: "query" }, query), " · language ");
    meta.append(el("span", { class: "lang", "data-code": lang.code },
      lang.code + " (" + lang.source + ", " + lang.confidence.toFixed(2) + (lang.supported ? "" : ", unsupported") + ")"));
    const t = data.timings_ms;
    meta.append(" · ", el("span", { class: "timings" },
      "encode " + t.encode + " ms · search " + t.search + " ms · re-rank " + t.rerank + " ms · total " + t.total + " ms" +
      (data.cached ? " (cached)" : "")));
    const searched = data.mode && data.mode !== "image" ? data.mode + " (photos, text and words fused)" : null;
    meta.append(" · ", el("span", { class: "reranked" },
      data.reranked ? "re-ranked" : (searched || "dual encoder")));
    section.append(meta);
    // The query's match quality (calibrated on the index): nothing in the catalogue matches it well.
    if (data.match === "none") {
      section.append(el("p", { class: "no-match", role: "status" },
        "No good match: nothing in the catalogue matches this query well; the closest items are shown greyed."));
    }
    const grid = el("div", { class: "grid" });
    for (const hit of data.results) {
      const card = el("figure", { class: "card" + (hit.match && hit.match !== "strong" ? " " + hit.match : ""),
        "data-id": hit.id, "data-match": hit.match || "" });
      const thumb = new URL(hit.image_url, location.href);  // the link may carry the id as a query already
      thumb.searchParams.set("size", "160");
      card.append(el("img", { src: thumb.pathname + thumb.search, alt: hit.id, loading: "lazy" }));
      const fused = data.mode && data.mode !== "image";
      const score = hit.rerank_score !== null && hit.rerank_score !== undefined
        ? "re-rank " + hit.rerank_score.toFixed(2) + " · cos " + hit.score.toFixed(3)
        : (fused ? "fused " : "cos ") + hit.score.toFixed(3);
      const cap = el("figcaption");
      cap.append(el("span", { class: "rank" }, "#" + (hit.rank + 1)), " ", el("span", { class: "id" }, hit.id));
      // A product card: the shop's title, its price, how many photos it has, and why it matched.
      const md = hit.metadata || {};
      if (typeof md.title === "string") cap.append(el("br"), el("span", { class: "title" }, md.title));
      if (typeof md.price === "number") cap.append(el("br"), el("span", { class: "price" }, md.price.toFixed(2)));
      if (hit.images && hit.images.length > 1) cap.append(" ", el("span", { class: "photos" }, hit.images.length + " photos"));
      cap.append(el("br"), el("span", { class: "score" }, score));
      if (hit.match) cap.append(" ", el("span", { class: "match", title: "match quality" }, hit.match));
      // Placed by a merchandising rule of the shop (its rules named when explained).
      if (hit.pinned) {
        const rules = hit.explain && hit.explain.rules ? hit.explain.rules.join(", ") : "";
        cap.append(" ", el("span", { class: "pinned", title: rules ? "pinned by rule " + rules : "pinned" }, "pinned"));
      }
      if (hit.explain) {
        const why = [];
        if (hit.explain.terms && hit.explain.terms.length) {
          why.push("words in " + hit.explain.lexical_field + ": " + hit.explain.terms.join(", "));
        }
        if (hit.explain.text_field) why.push("meaning of " + hit.explain.text_field);
        const ch = hit.explain.channels || {};
        if (ch.image && ch.image.rank !== null && ch.image.rank < 10) why.push("photo");
        if (why.length) cap.append(el("br"), el("span", { class: "why" }, "matched: " + why.join(" · ")));
      }
      card.append(cap);
      grid.append(card);
    }
    if (!data.results.length) grid.append(el("p", { class: "empty" }, "No result."));
    section.append(grid);
    return section;
  }

  // The address bar holds the (first) query and its language hint: a search can be shared as a link,
  // which the server fills in and this script runs on load (below).
  function rememberQuery(query, lang) {
    const params = new URLSearchParams();
    params.set("q", query);
    if (lang) params.set("lang", lang);
    history.replaceState(null, "", location.pathname + "?" + params.toString());
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    errorBox.hidden = true;
    rememberQuery($("query").value, $("lang").value);
    results.replaceChildren(el("p", { class: "busy" }, "Searching…"));
    const compare = $("compare").checked;
    const queries = [[$("query").value, $("lang").value]];
    if (compare) queries.push([$("query-b").value, $("lang-b").value]);
    try {
      const answers = await Promise.all(queries.map(([q, l]) => search(q, l)));
      const panels = answers.map((data, i) => panel(i ? "b" : "a", queries[i][0], data));
      results.replaceChildren(...panels);
      results.classList.toggle("compare", compare);
      if (compare) {
        const idsB = new Set(answers[1].results.map((h) => h.id));
        const shared = answers[0].results.filter((h) => idsB.has(h.id)).map((h) => h.id);
        const sharedSet = new Set(shared);
        for (const card of results.querySelectorAll(".card")) {
          if (sharedSet.has(card.dataset.id)) card.classList.add("shared");
        }
        const summary = el("p", { id: "shared-summary", class: "shared-summary" },
          shared.length + " of " + answers[0].results.length + " items shared by both languages (highlighted)");
        results.prepend(summary);
      }
      results.dataset.done = String(Date.now());
    } catch (err) {
      results.replaceChildren();
      errorBox.textContent = "Search failed: " + err.message;
      errorBox.hidden = false;
    }
  });

  if (form.dataset.autorun && $("query").value.trim()) form.requestSubmit();
})();
