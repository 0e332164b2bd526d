// Draws a report's chart blocks with Plotly from the data in #report-charts (a version's frozen
// curves, or the draft's live ones): a line per (line, staleness) group, its band shaded. The
// same file runs inline in an exported report, offline. Plotly renders HTML in its text, and
// metric names, lines and staleness labels are user input: every text goes through escapeText
// (experiments/plots.js, loaded before this file, inline in the export too).
(function () {
  "use strict";
  const source = document.getElementById("report-charts");
  if (!source || typeof Plotly === "undefined") return;
  const { escapeText } = window.LabPlots;
  const charts = JSON.parse(source.textContent);
  const dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  document.querySelectorAll(".report-chart").forEach((element) => {
    const chart = charts[element.dataset.index];
    if (!chart) return;
    const traces = [];
    chart.groups.forEach((group) => {
      const colour = chart.colours[group.preset] || "#444444";
      const dash = dashes[Math.max(0, chart.staleness.indexOf(group.staleness)) % dashes.length];
      const name = escapeText(`${group.line} · ${group.staleness}`);
      if (group.lo && group.hi) {
        traces.push({
          x: group.x.concat(group.x.slice().reverse()),
          y: group.hi.concat(group.lo.slice().reverse()),
          fill: "toself",
          mode: "lines",
          fillcolor: colour + "22",
          line: { width: 0 },
          hoverinfo: "skip",
          showlegend: false,
          legendgroup: name,
          type: "scatter",
        });
      }
      traces.push({
        x: group.x,
        y: group.mean,
        name: `${name} (${group.n_seeds} seed${group.n_seeds === 1 ? "" : "s"})`,
        legendgroup: name,
        line: { color: colour, dash: dash },
        mode: "lines",
        type: "scatter",
      });
    });
    const layout = {
      margin: { t: 30, r: 10, b: 40, l: 50 },
      xaxis: { title: { text: escapeText(chart.x) } },
      yaxis: { title: { text: escapeText(chart.metric) } },
      title: { text: escapeText(`${chart.metric} (band: ${chart.band})`), font: { size: 13 } },
    };
    Plotly.newPlot(element, traces, layout, { responsive: true, displaylogo: false }).then(() => {
      element.dataset.drawn = String(traces.length);
    });
  });
})();
