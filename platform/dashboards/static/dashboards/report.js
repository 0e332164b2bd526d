// Draws a report's chart blocks with Plotly from the data in #report-charts (a version's frozen
// curves, or the draft's live ones) as the block's link shows them on the comparison page: small
// multiples, one panel per value of its "panels by" field (`view=grid`, the page's default), or one
// overlay (`view=overlay`); colours by its "colour by" field, dashes as the page draws them. The
// same file runs inline in an exported report, offline. Plotly renders HTML in its text, and metric
// names, lines and staleness labels are user input: every text goes through escapeText
// (experiments/plots.js, loaded before this file, inline in the export too).
(function () {
  "use strict";
  const source = document.getElementById("report-charts");
  if (!source || typeof Plotly === "undefined") return;
  const { escapeText } = window.LabPlots;
  const charts = JSON.parse(source.textContent);
  const DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  const FALLBACK_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#d55e00", "#8c564b"];

  // The fields a chart can split by: preset, staleness and each varied field (the page's `fields`).
  function fieldsOf(chart) {
    if (chart.fields && chart.fields.length) return chart.fields;
    const values = (key) => [...new Set(chart.groups.map((g) => g[key]))];
    return [
      { name: "preset", label: "preset", values: values("preset") },
      { name: "staleness", label: "staleness", values: chart.staleness },
    ];
  }

  function valueOf(group, field) {
    if (field === "preset" || field === "staleness") return String(group[field]);
    return group.variant && field in group.variant ? String(group.variant[field]) : "–";
  }

  function draw(element, chart) {
    const fields = fieldsOf(chart);
    const field = (name, fallback) => fields.find((f) => f.name === name) || fields.find((f) => f.name === fallback);
    const view = chart.view === "overlay" ? "overlay" : "grid";
    const facet = field(chart.facet, "staleness");
    const colourBy = field(chart.colour, "preset");
    const palette = chart.palette && chart.palette.length ? chart.palette : FALLBACK_PALETTE;
    const presets = [...new Set(chart.groups.map((g) => g.preset))];
    const variants = [...new Set(chart.groups.map((g) => g.variant_label || ""))];

    const colourOf = (g) => {
      if (colourBy.name === "preset") return chart.colours[g.preset] || "#444444";
      const index = colourBy.values.map(String).indexOf(valueOf(g, colourBy.name));
      return palette[Math.max(0, index) % palette.length];
    };
    const dashOf = (g) => {
      if (view === "overlay") return DASHES[Math.max(0, chart.staleness.indexOf(g.staleness)) % DASHES.length];
      if (colourBy.name === "preset") return DASHES[Math.max(0, variants.indexOf(g.variant_label || "")) % DASHES.length];
      return DASHES[presets.indexOf(g.preset) % DASHES.length];
    };
    // A group's name: what tells it apart within its panel (all but the panels' field).
    const nameOf = (g, panelsBy) => {
      const parts = [];
      if (panelsBy !== "preset") parts.push(g.line || g.preset);
      if (panelsBy !== "staleness") parts.push(g.staleness);
      return parts.join(" · ");
    };
    const tracesOf = (g, name, showlegend) => {
      const colour = colourOf(g);
      const label = escapeText(name);
      const traces = [];
      if (g.lo && g.hi) {
        traces.push({
          x: g.x.concat(g.x.slice().reverse()),
          y: g.hi.concat(g.lo.slice().reverse()),
          fill: "toself",
          mode: "lines",
          fillcolor: colour + "22",
          line: { width: 0 },
          hoverinfo: "skip",
          showlegend: false,
          legendgroup: label,
          type: "scatter",
        });
      }
      traces.push({
        x: g.x,
        y: g.mean,
        name: `${label} (${g.n_seeds} seed${g.n_seeds === 1 ? "" : "s"})`,
        legendgroup: label,
        showlegend,
        line: { color: colour, dash: dashOf(g) },
        mode: "lines",
        type: "scatter",
      });
      return traces;
    };
    const layoutOf = (title) => ({
      height: 340,
      margin: { t: 30, r: 10, b: 40, l: 50 },
      xaxis: { title: { text: escapeText(chart.x) }, automargin: true },
      yaxis: { title: { text: escapeText(chart.metric) }, automargin: true },
      title: { text: escapeText(title), font: { size: 13 } },
      legend: { orientation: "h", y: -0.25 },
    });
    const config = { responsive: true, displaylogo: false };

    if (view === "overlay") {
      const traces = chart.groups.flatMap((g) => tracesOf(g, nameOf(g, ""), true));
      element.dataset.panels = "1";
      return Plotly.newPlot(element, traces, layoutOf(`${chart.metric} (band: ${chart.band})`), config).then(() => traces.length);
    }
    const values = facet.values.map(String);
    const panels = values.map((value) => {
      const panel = document.createElement("div");
      panel.className = "report-panel";
      panel.dataset.facet = value;
      return panel;
    });
    Object.assign(element.style, { display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(360px, 1fr))", gap: "0.5rem" });
    element.replaceChildren(...panels);
    element.dataset.panels = String(panels.length);
    const seen = new Set();
    const drawn = values.map((value, i) => {
      const members = chart.groups.filter((g) => valueOf(g, facet.name) === value);
      const traces = members.flatMap((g) => {
        const name = nameOf(g, facet.name);
        const first = !seen.has(name);
        seen.add(name);
        return tracesOf(g, name, first);
      });
      return Plotly.newPlot(panels[i], traces, layoutOf(`${chart.metric} · ${facet.label}: ${value}`), config).then(() => traces.length);
    });
    return Promise.all(drawn).then((counts) => counts.reduce((a, b) => a + b, 0));
  }

  document.querySelectorAll(".report-chart").forEach((element) => {
    const chart = charts[element.dataset.index];
    if (!chart) return;
    draw(element, chart).then((traces) => {
      element.dataset.drawn = String(traces);
    });
  });
})();
