// The comparison page's few-seed statistics (the payload's `statistics`, rliable's): the IQM and
// mean table per line × setting, P(a > b) per setting, and the performance profile of a chosen
// setting with its bands. Redrawn whenever compare.js has new data ("comparison" event). Names go
// through textContent, or through escapeText into Plotly.
"use strict";

(() => {
  const root = document.getElementById("compare");
  const { escapeText, config } = window.LabPlots;
  const picker = document.getElementById("profile-setting");
  let latest = null;

  const fmt = (v, digits) => (v === null || v === undefined ? "–" : v.toFixed(digits));
  const estimate = (e, digits) => `${fmt(e.value, digits)} [${fmt(e.lo, digits)}, ${fmt(e.hi, digits)}]`;

  function row(table, cells, head = false) {
    const tr = table.insertRow();
    for (const text of cells) {
      const cell = document.createElement(head ? "th" : "td");
      cell.textContent = text;
      tr.append(cell);
    }
    return tr;
  }

  function drawTables(payload) {
    const stats = payload.statistics;
    const digits = Math.max(3, payload.digits);
    const first = stats.cells[0];
    document.getElementById("statistics-method").textContent = first
      ? `${first.iqm.method}, ${first.iqm.reps} reps (P(a > b): ${stats.improvement[0] ? stats.improvement[0].poi.reps : "–"}), RNG seed ${first.iqm.seed}, ${Math.round(first.iqm.confidence * 100)}% CIs from ${stats.few_seeds} seeds on; fewer: the estimate alone, no CI, as everywhere on this page.`
      : "No final values yet.";
    const table = document.getElementById("iqm");
    table.replaceChildren();
    row(table, [`${payload.metric}, ${payload.rule}`, ...payload.staleness.flatMap((s) => [`IQM at ${s}`, `mean at ${s}`])], true);
    const cells = new Map(stats.cells.map((c) => [`${c.line}\u0000${c.staleness}`, c]));
    for (const { line } of payload.lines) {
      const values = payload.staleness.flatMap((s) => {
        const c = cells.get(`${line}\u0000${s}`);
        if (!c) return ["", ""];
        const early = c.n_ended_early ? ` · ${c.n_ended_early} ended early, left out` : "";
        const going = c.n_active ? ` · provisional: ${c.n_active} still going, their values so far` : "";
        const value = (e) => (c.few_seeds ? fmt(e.value, digits) : estimate(e, digits));
        const mark = ` (${c.n} seed${c.n === 1 ? "" : "s"}${c.few_seeds ? `, no CI below ${stats.few_seeds}` : ""}${early}${going})`;
        return [value(c.iqm) + mark, value(c.mean)];
      });
      row(table, [line, ...values]).dataset.line = line;
    }
    const poi = document.getElementById("improvement");
    poi.replaceChildren();
    row(poi, ["setting", "a", "b", "P(a > b) [95% CI]", "pairing", "seeds"], true);
    for (const r of stats.improvement) {
      const p = r.poi.n >= stats.few_seeds ? estimate(r.poi, 2) : `${fmt(r.poi.value, 2)} (no CI below ${stats.few_seeds} seeds)`;
      const tr = row(poi, [r.staleness, r.a, r.b, p, r.paired ? "paired by seed" : "unpaired (other seeds)", String(r.poi.n)]);
      tr.dataset.a = r.a;
      tr.dataset.b = r.b;
      tr.dataset.staleness = r.staleness;
    }
  }

  function drawProfile(payload) {
    const profiles = payload.statistics.profiles;
    const chosen = picker.value;
    picker.replaceChildren(...profiles.map((p) => new Option(p.staleness, p.staleness)));
    if (profiles.some((p) => p.staleness === chosen)) picker.value = chosen;
    const profile = profiles.find((p) => p.staleness === picker.value);
    const element = document.getElementById("profile");
    if (!profile) {
      element.replaceChildren();
      return;
    }
    const colour = (line) => payload.colours[(payload.lines.find((l) => l.line === line) || {}).preset] || "#444";
    const few = payload.statistics.few_seeds;
    const traces = profile.lines.flatMap((l) => [
      // The CI band as two steps, the upper filled down to the lower; none below `few` seeds (no CI).
      ...(l.n < few ? [] : [
      { x: profile.taus, y: l.lo, line: { width: 0, shape: "hv" }, hoverinfo: "skip", showlegend: false, meta: { kind: "band-lo", line: l.line } },
      { x: profile.taus, y: l.hi, fill: "tonexty", line: { width: 0, shape: "hv" }, fillcolor: `${colour(l.line)}33`, hoverinfo: "skip", showlegend: false, meta: { kind: "band", line: l.line } },
      ]),
      { x: profile.taus, y: l.value, name: escapeText(l.line), line: { color: colour(l.line), shape: "hv" }, meta: { kind: "profile", line: l.line } },
    ]);
    const layout = {
      height: 360,
      margin: { t: 30, r: 10, b: 50, l: 60 },
      title: { text: escapeText(`share of runs above τ at ${profile.staleness}${profile.lines.some((l) => l.n < few) ? ` (no CI band below ${few} seeds)` : ""}`), font: { size: 13 } },
      xaxis: { title: { text: escapeText(`τ (${payload.metric}, ${payload.rule})`) } },
      yaxis: { title: { text: "fraction of runs > τ" }, range: [0, 1.05] },
      legend: { orientation: "h" },
    };
    Plotly.newPlot(element, traces, layout, config(`profile-${profile.staleness}`));
  }

  root.addEventListener("comparison", (event) => {
    latest = event.detail.payload;
    drawTables(latest);
    drawProfile(latest);
  });
  picker.addEventListener("change", () => latest && drawProfile(latest));
})();
