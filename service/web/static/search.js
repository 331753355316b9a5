// The search page: /v1/search for one query, or two side by side (compare mode) with shared items marked.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const results = $("results");
  const errorBox = $("error");
  // Facets (service.search.facets): the fields to count, the price field and its currency (CCRK_PAGE_*).
  const facetBox = $("facets");
  const facetFields = JSON.parse(facetBox.dataset.fields || "[]");
  const priceField = facetBox.dataset.priceField || "price";
  const currency = facetBox.dataset.currency || "";
  const picked = {};  // field -> Set of JSON-encoded values ticked (any of them: one any-of filter)
  const bands = {};  // numeric field -> its price bands [[from, to), ...], drawn from the first answer's min/max
  const pickedBands = {};  // field -> Set of band indexes ticked
  let facetQuery = null;  // the query the selection belongs to: a new query starts afresh
  const money = currency
    ? new Intl.NumberFormat(undefined, { style: "currency", currency: currency })
    : null;

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

  function facetRequest() {
    return facetFields.map((field) => (bands[field] ? { field: field, ranges: bands[field] } : field));
  }

  // The ticked values as filters: values of one field are any-of; bands of one field their span (adjacent
  // bands ticked together make one range; others the lowest to the highest ticked).
  function facetFilters() {
    const filters = {};
    for (const [field, values] of Object.entries(picked)) {
      if (values.size) filters[field] = [...values].map((v) => JSON.parse(v));
    }
    for (const [field, chosen] of Object.entries(pickedBands)) {
      if (!chosen.size || !bands[field]) continue;
      const ticked = [...chosen].map((i) => bands[field][i]);
      const lows = ticked.map((b) => b[0]);
      const highs = ticked.map((b) => b[1]);
      const range = {};
      if (!lows.includes(null)) range.gte = Math.min(...lows);
      if (!highs.includes(null)) range.lt = Math.max(...highs);
      if (Object.keys(range).length) filters[field] = range;
    }
    return filters;
  }

  async function search(query, lang) {
    const body = { query: query, top_k: Number($("top-k").value) || 24, rerank: $("rerank").checked };
    if (facetFields.length) body.facets = facetRequest();
    const filters = facetFilters();
    if (Object.keys(filters).length) body.filters = filters;
    if (lang) body.lang = lang;
    const mode = $("mode") ? $("mode").value : "";
    if (mode) body.mode = mode;
    if ($("typos") && $("typos").value !== "") body.typos = Number($("typos").value);
    if ($("synonyms") && !$("synonyms").checked) body.synonyms = false;
    // Products (an index with text fields): say why each product matched.
    if ($("mode") && mode !== "image") body.explain = true;
    const response = await fetch("/v1/search", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await response.json();
    if (!response.ok) {
      // A facet field the page offers (by default every field not searched) that the index refuses to
      // count: values too long for a facet (a description), or a field it lacks. The page counts it no
      // more and asks again, rather than failing every search.
      const refused = response.status === 422 && body.facets && (data.detail || []).map((d) => d.loc || [])
        .find((loc) => loc[0] === "body" && loc[1] === "facets" && typeof loc[2] === "string");
      if (refused) {
        const at = facetFields.indexOf(refused[2]);
        if (at >= 0) facetFields.splice(at, 1);
        return search(query, lang);
      }
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
    // Typo tolerance corrected some of the query's words: say what was searched instead.
    if (data.corrected_query) {
      const said = el("p", { class: "corrected", role: "status" }, "Showing results for ");
      said.append(el("q", { class: "corrected-query" }, data.corrected_query));
      section.append(said);
    }
    // The query's match quality (calibrated on the index): its top label none, nothing the shop holds matches it.
    // The closest items are still shown, greyed, so a shopper sees what the shop has instead.
    if (data.match === "none") {
      const notice = el("p", { class: "no-match", role: "status" }, "Nothing in the catalogue matches ");
      notice.append(el("q", {}, query), ". The closest items are shown greyed below.");
      section.append(notice);
    }
    const grid = el("div", { class: "grid" });
    for (const hit of data.results) {
      const card = el("figure", { class: "card" + (hit.match && hit.match !== "strong" ? " " + hit.match : ""),
        "data-id": hit.id, "data-match": hit.match || "" });
      // The product's first (catalogue) photo; the one that matched is named below when it is another.
      const first = hit.images && hit.images.length ? hit.images[0] : hit.image_url;
      const thumb = new URL(first, location.href);  // the link may carry the id as a query already
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
      const price = md[priceField];
      if (typeof price === "number") {
        cap.append(el("br"), el("span", { class: "price" },
          money ? money.format(price) : priceField + " " + price.toFixed(2)));
      }
      if (hit.images && hit.images.length > 1) {
        cap.append(" ", el("span", { class: "photos" }, hit.images.length + " photos"));
        const matched = hit.images.indexOf(hit.image_url);
        if (matched > 0) {
          cap.append(el("span", { class: "matched-photo" }, "photo " + (matched + 1) + " of " + hit.images.length + " matched"));
        }
      }
      cap.append(el("br"), el("span", { class: "score" }, score));
      if (hit.match) cap.append(" ", el("span", { class: "match", title: "match quality" }, hit.match));
      // Placed by a merchandising rule of the shop (its rules named when explained).
      if (hit.pinned) {
        card.classList.add("pinned");
        const rules = hit.explain && hit.explain.rules ? hit.explain.rules.join(", ") : "";
        cap.append(" ", el("span", { class: "pinned", title: rules ? "pinned by rule " + rules : "pinned" }, "pinned"));
      }
      if (hit.explain) {
        const why = [];
        if (hit.explain.terms && hit.explain.terms.length) {
          why.push("words in " + hit.explain.lexical_field + ": " + hit.explain.terms.join(", "));
        }
        const typos = Object.entries(hit.explain.typos || {});
        if (typos.length) why.push("as corrected: " + typos.map(([typed, form]) => typed + " → " + form).join(", "));
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

  function niceBands(low, high) {
    // Four bands over [low, high] at round numbers (1, 2 or 5 times a power of ten).
    const span = high - low;
    if (!(span > 0)) return null;
    const raw = span / 4;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((x) => x >= raw);
    const cuts = [];
    for (let x = Math.ceil(low / step) * step; x < high && cuts.length < 3; x += step) {
      if (x > low) cuts.push(Number(x.toPrecision(12)));
    }
    if (!cuts.length) return null;
    return [[null, cuts[0]], ...cuts.slice(1).map((c, i) => [cuts[i], c]), [cuts[cuts.length - 1], null]];
  }

  function bandLabel(band) {
    const fmt = (x) => (money ? money.format(x) : String(x));
    if (band[0] === null) return "under " + fmt(band[1]);
    if (band[1] === null) return fmt(band[0]) + " and over";
    return fmt(band[0]) + " – " + fmt(band[1]);
  }

  function renderFacets(data) {
    facetBox.replaceChildren();
    const facets = data.facets || [];
    facetBox.hidden = !facets.length;
    for (const facet of facets) {
      const group = el("section", { class: "facet", "data-field": facet.field });
      group.append(el("h3", {}, facet.field === priceField && currency ? facet.field + " (" + currency + ")" : facet.field));
      if (facet.ranges) {
        facet.ranges.forEach((range, i) => {
          const ticked = pickedBands[facet.field] && pickedBands[facet.field].has(i);
          group.append(option(facet.field, bandLabel([range.gte, range.lt]), range.count, ticked, () => {
            const set = (pickedBands[facet.field] = pickedBands[facet.field] || new Set());
            set.has(i) ? set.delete(i) : set.add(i);
          }, "band-" + i));
        });
      } else {
        const ticked = picked[facet.field] || new Set();
        const shown = new Set(facet.values.map((v) => JSON.stringify(v.value)));
        for (const v of facet.values) {
          const key = JSON.stringify(v.value);
          group.append(option(facet.field, String(v.value), v.count, ticked.has(key), () => toggle(facet.field, key)));
        }
        for (const key of ticked) {  // a ticked value with no relevant result left still shows, at 0
          if (!shown.has(key)) group.append(option(facet.field, String(JSON.parse(key)), 0, true, () => toggle(facet.field, key)));
        }
      }
      if (facet.min !== null && facet.max !== null && facet.min !== facet.max && !facet.ranges && !facet.values.length) {
        group.append(el("p", { class: "range-note" }, facet.min + " – " + facet.max));
      }
      facetBox.append(group);
    }
    const any = Object.values(picked).some((s) => s.size) || Object.values(pickedBands).some((s) => s.size);
    if (any) {
      const clear = el("button", { type: "button", class: "clear" }, "clear filters");
      clear.addEventListener("click", () => {
        for (const k of Object.keys(picked)) delete picked[k];
        for (const k of Object.keys(pickedBands)) delete pickedBands[k];
        run();
      });
      facetBox.append(clear);
    }
  }

  function toggle(field, key) {
    const set = (picked[field] = picked[field] || new Set());
    set.has(key) ? set.delete(key) : set.add(key);
  }

  function option(field, label, count, ticked, change, name) {
    const row = el("label", { "data-value": name || label });
    const box = el("input", { type: "checkbox" });
    box.checked = ticked;
    box.addEventListener("change", () => { change(); run(); });
    row.append(box, el("span", { class: "value" }, label), el("span", { class: "count" }, String(count)));
    return row;
  }

  // Numeric facets with a spread get bands drawn from the first answer of a query; asked again with them.
  function drawBands(data) {
    let drawn = false;
    for (const facet of data.facets || []) {
      if (!bands[facet.field] && facet.min !== null && facet.max !== null && !facet.values.some((v) => typeof v.value !== "number")) {
        const b = niceBands(facet.min, facet.max);
        if (b) { bands[facet.field] = b; drawn = true; }
      }
    }
    return drawn;
  }

  // The address bar holds the (first) query and its language hint: a search can be shared as a link,
  // which the server fills in and this script runs on load (below).
  function rememberQuery(query, lang) {
    const params = new URLSearchParams();
    params.set("q", query);
    if (lang) params.set("lang", lang);
    if ($("mode") && $("mode").value) params.set("mode", $("mode").value);
    if ($("typos") && $("typos").value !== "") params.set("typos", $("typos").value);
    if ($("synonyms") && !$("synonyms").checked) params.set("synonyms", "false");
    history.replaceState(null, "", location.pathname + "?" + params.toString());
  }

  function run() { form.requestSubmit(); }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    errorBox.hidden = true;
    if ($("query").value !== facetQuery) {  // a new query: its own facets, nothing ticked
      facetQuery = $("query").value;
      for (const store of [picked, bands, pickedBands]) for (const k of Object.keys(store)) delete store[k];
    }
    rememberQuery($("query").value, $("lang").value);
    results.replaceChildren(el("p", { class: "busy" }, "Searching…"));
    const compare = $("compare").checked;
    const queries = [[$("query").value, $("lang").value]];
    if (compare) queries.push([$("query-b").value, $("lang-b").value]);
    try {
      let answers = await Promise.all(queries.map(([q, l]) => search(q, l)));
      if (drawBands(answers[0])) answers = await Promise.all(queries.map(([q, l]) => search(q, l)));
      renderFacets(answers[0]);
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
      facetBox.hidden = true;
      errorBox.textContent = "Search failed: " + err.message;
      errorBox.hidden = false;
    }
  });

  if (form.dataset.autorun && $("query").value.trim()) form.requestSubmit();
})();
