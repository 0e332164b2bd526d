// What the dashboard and the run page share: escaping for Plotly's text fields, and the chart
// config whose toolbar downloads the chart as PNG (Plotly's camera) or as SVG (our button).
"use strict";

window.LabPlots = (() => {
  // Plotly renders names, titles and hover text as HTML-ish markup (it decodes entities for display);
  // every name we show is user input (presets, staleness labels, metric names, experiment names).
  function escapeText(text) {
    return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  }

  // `filename` (without extension) names both downloads.
  function config(filename) {
    const safe = String(filename).replace(/[^A-Za-z0-9_.-]+/g, "-");
    return {
      displaylogo: false,
      responsive: true,
      toImageButtonOptions: { format: "png", filename: safe },
      modeBarButtonsToAdd: [
        {
          name: "svg",
          title: "Download plot as SVG",
          icon: Plotly.Icons.camera,
          click: (chart) => Plotly.downloadImage(chart, { format: "svg", filename: safe }),
        },
      ],
    };
  }

  return { escapeText, config };
})();
