// Draws the figures the server built (plotly figure JSON by element id) with the local plotly.js.
(function () {
  "use strict";
  const figures = JSON.parse(document.getElementById("figures").textContent);
  const drawn = [];
  for (const [id, json] of Object.entries(figures)) {
    const el = document.getElementById(id);
    if (!el) continue;
    const fig = JSON.parse(json);
    drawn.push(Plotly.newPlot(el, fig.data, fig.layout, { responsive: true, displaylogo: false }));
  }
  Promise.all(drawn).then(function () { document.body.dataset.chartsReady = "1"; });
})();
