// The run page's curves: one small Plotly chart per metric the run logged, from the `run-curves` JSON.
// While the run is queued or running the JSON is polled every few seconds and the charts redrawn in
// place (Plotly.react), without reloading the page. Metric names are user input: they only ever go
// through textContent or escaped Plotly text, never innerHTML.
"use strict";

(() => {
  const POLL_MS = 3000;
  const FIRST = ["reward/mean", "eval/accuracy", "kl/init", "kl/behavior"];
  const { escapeText } = window.LabPlots;

  const root = document.getElementById("run-curves");
  const grid = root.querySelector(".curve-grid");
  const status = document.getElementById("run-curves-status");
  const damagedList = document.getElementById("run-curves-damaged");
  const panels = new Map(); // metric name → its chart element
  let shown = ""; // the metric names in the grid, in order
  let draws = 0;

  // The headline metrics first, then the rest alphabetically (by code point, as Python sorts).
  function order(names) {
    const rest = names.filter((n) => !FIRST.includes(n)).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return [...FIRST.filter((n) => names.includes(n)), ...rest];
  }

  function panel(name) {
    if (!panels.has(name)) {
      const el = document.createElement("div");
      el.className = "curve";
      el.dataset.metric = name;
      panels.set(name, el);
    }
    return panels.get(name);
  }

  // A constant metric (lr without a schedule: 3e-05) gets a range around its value, not Plotly's
  // default of ±1, which draws it as a flat line at 0; small values read as 3e-05, not 30µ.
  function yAxis(y) {
    const finite = y.filter((v) => v !== null && Number.isFinite(v));
    const axis = { exponentformat: "e" };
    if (finite.length === 0) return axis;
    const lo = Math.min(...finite);
    const hi = Math.max(...finite);
    if (hi - lo <= 1e-9 * Math.max(Math.abs(hi), 1e-30)) {
      const pad = Math.abs(hi) > 0 ? Math.abs(hi) * 0.5 : 1;
      axis.range = [hi - pad, hi + pad];
    }
    return axis;
  }

  // Chunks of points that cannot be read: each a gap in its curve and a note naming its metric.
  function showDamaged(damaged) {
    const notes = order(Object.keys(damaged)).flatMap((name) => damaged[name]);
    damagedList.replaceChildren(
      ...notes.map((text) => {
        const item = document.createElement("li");
        item.textContent = text;
        return item;
      }),
    );
    damagedList.hidden = notes.length === 0;
  }

  function draw(payload) {
    showDamaged(payload.damaged || {});
    const names = order(Object.keys(payload.metrics));
    // Every panel is in the grid before the first is drawn, so Plotly sizes each to its own column.
    const key = JSON.stringify(names);
    if (key !== shown) {
      grid.replaceChildren(...names.map(panel));
      shown = key;
    }
    for (const name of names) {
      const { x, y } = payload.metrics[name];
      const trace = {
        x,
        y,
        type: "scatter",
        mode: x.length <= 50 ? "lines+markers" : "lines",
        marker: { size: 4 },
        line: { color: "#1f77b4", width: 1.5 },
        hovertemplate: "%{y:.4g} at step %{x}<extra></extra>",
      };
      const layout = {
        height: 220,
        margin: { l: 55, r: 10, t: 30, b: 30 },
        yaxis: yAxis(y),
        // Left-aligned, so a long name shows its start and runs off on the right.
        title: {
          text: escapeText(name in (payload.damaged || {}) ? `${name} (damaged: a gap)` : name),
          font: { size: 13 },
          x: 0,
          xref: "paper",
          xanchor: "left",
        },
        showlegend: false,
      };
      Plotly.react(panel(name), [trace], layout, window.LabPlots.config(`run-${payload.run}-${name}`));
    }
    const n = names.length;
    status.textContent =
      n === 0
        ? `No metrics yet${payload.active ? "; refreshing while the run is active" : "."}`
        : `${n} metric${n === 1 ? "" : "s"}${payload.active ? " · the run is active, refreshing" : ""}`;
    draws += 1;
    root.dataset.rendered = String(draws);
  }

  async function load() {
    let active = true;
    try {
      const response = await fetch(root.dataset.url, { credentials: "same-origin" });
      if (!response.ok) {
        status.textContent = `Could not load the curves (error ${response.status}).`;
        return;
      }
      const payload = await response.json();
      active = payload.active;
      draw(payload);
    } catch (error) {
      status.textContent = `Could not load the curves (${error.message}); retrying.`;
    }
    if (active) setTimeout(load, POLL_MS);
  }

  load();
})();
