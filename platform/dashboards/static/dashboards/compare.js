// The comparison page: draws what the JSON endpoint aggregated, and keeps every control in the URL.
// A line is one preset of one experiment with its values of the sweep's other axes (`line` in the
// payload; just the preset for one experiment of presets × staleness × seeds). The panels split by
// one field ("panels by": staleness unless chosen) and the colours by another (its preset's colour
// unless chosen), any varied field among them; with runs of several experiments the dash tells
// experiments apart. "Changing one varied field" pairs cells that differ in that field only.
// Changing metric, x axis, band or final-value rule fetches again; view and smoothing only redraw.
// Runs whose policy collapsed are counted in the final-value table and listed below it.
// Below the curves, the trade-off: the final value and the steady-state throughput (steps per hour,
// tokens/s, tokens per CPU second; contended runs left out unless counted), each against the cells'
// mean lag, and each distributed or async cell's speed-up beside the accuracy it gave up; then the staleness answer: each line's drop from its own
// on-policy runs (paired by seed), its tolerance within δ and rank, presets the seeds cannot tell apart,
// and the paper's claims checked against the data.
// While a run is queued or running the data is polled every few seconds, without reloading the page.
// Names (presets, staleness labels, metrics) are user input: they only ever go through textContent
// or Plotly's text fields, never innerHTML.
"use strict";

(() => {
  const POLL_MS = 3000;
  const DEFAULTS = { metric: "eval/accuracy", x: "step", band: "std", view: "grid", facet: "staleness", colour: "preset", smooth: "0", rule: "last", k: "10", delta: "0.02", contended: "0" };
  const FETCHED = ["metric", "x", "band", "rule", "k", "delta", "contended"];
  const SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star", "triangle-down"];
  const DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  const X_TITLES = { step: "step", samples: "samples seen", tokens: "response tokens seen", time: "wall time (s)" };
  const { escapeText } = window.LabPlots;

  const root = document.getElementById("compare");
  const form = document.getElementById("controls");
  const plots = document.getElementById("plots");
  const status = document.getElementById("status");
  let payload = null;
  let fetched = "";
  let pollTimer = null;

  // Hand-picked runs (`?runs=…`) stay in every URL; an experiment's page has none.
  const FIXED = root.dataset.runs ? [["runs", root.dataset.runs]] : [];

  const control = (name) => form.elements[name];

  function readUrl() {
    const query = new URLSearchParams(location.search);
    for (const [name, fallback] of Object.entries(DEFAULTS)) {
      const el = control(name);
      const value = query.get(name) ?? fallback;
      if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === value)) el.add(new Option(value, value));
      el.value = value;
    }
  }

  function state() {
    return Object.fromEntries(Object.keys(DEFAULTS).map((name) => [name, control(name).value]));
  }

  function dataQuery() {
    const s = state();
    return new URLSearchParams([...FIXED, ...FETCHED.map((name) => [name, s[name]])]).toString();
  }

  function writeUrl() {
    history.replaceState(null, "", "?" + new URLSearchParams([...FIXED, ...Object.entries(state())]).toString());
  }

  // Downloads are named after what they show: `<metric>-<x>-<chart>.png` / `.svg`.
  function plotConfig(chart) {
    return window.LabPlots.config(`${control("metric").value}-${control("x").value}-${chart}`);
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  // Exponential moving average with the (1 - w^t) debiasing of Adam, so the start is not pulled to zero.
  function smooth(values, weight) {
    if (weight <= 0) return values;
    let average = 0;
    let t = 0;
    return values.map((v) => {
      if (v === null) return null;
      t += 1;
      average = weight * average + (1 - weight) * v;
      return average / (1 - weight ** t);
    });
  }

  // A group's value of a field the page can split by: preset, staleness or a varied config field.
  function valueOf(group, field) {
    if (field === "preset" || field === "staleness") return String(group[field]);
    return field in group.variant ? String(group.variant[field]) : "–";
  }

  function fieldOf(name) {
    return payload.fields.find((f) => f.name === name) || payload.fields[0];
  }

  function colourOf(group) {
    const field = fieldOf(control("colour").value);
    if (field.name === "preset") return payload.colours[group.preset];
    const index = field.values.map(String).indexOf(valueOf(group, field.name));
    return payload.palette[Math.max(0, index) % payload.palette.length];
  }

  // A group's name in a legend: what tells it apart within its panel (all but the panels' field).
  function nameOf(group, facet) {
    const parts = [];
    if (facet !== "preset") parts.push(group.preset);
    for (const f of payload.fields.slice(2)) if (f.name !== facet && f.name in group.variant) parts.push(`${f.label}=${group.variant[f.name]}`);
    if (facet !== "staleness") parts.push(group.staleness);
    if (payload.experiments.length > 1) parts.push(`#${group.experiment}`);
    return parts.join(" · ");
  }

  // The "panels by" and "colour by" choices: preset, staleness and each field the runs vary.
  function fillFieldControls() {
    for (const name of ["facet", "colour"]) {
      const el = control(name);
      const chosen = el.value;
      el.replaceChildren(...payload.fields.map((f) => new Option(f.label, f.name)));
      el.value = payload.fields.some((f) => f.name === chosen) ? chosen : DEFAULTS[name];
    }
  }

  function groupTraces(group, options) {
    const colour = colourOf(group);
    const name = escapeText(options.name);
    const traces = [];
    if (group.lo !== null) {
      const common = { x: group.x, type: "scatter", mode: "lines", hoverinfo: "skip", showlegend: false, line: { width: 0 } };
      traces.push({ ...common, y: group.lo, meta: { kind: "band-lo", preset: group.preset, line: group.line } });
      traces.push({ ...common, y: group.hi, fill: "tonexty", fillcolor: rgba(colour, 0.18), meta: { kind: "band-hi", preset: group.preset, line: group.line } });
    }
    const seeds = (group.n_seeds === 1 ? "1 seed" : `${group.n_seeds} seeds`) + (group.band !== control("band").value ? `, band ${group.band}: no CI below ${payload.min_ci_seeds} seeds` : "");
    traces.push({
      x: group.x,
      y: smooth(group.mean, Number(control("smooth").value)),
      type: "scatter",
      mode: "lines",
      name,
      legendgroup: name,
      showlegend: options.showlegend,
      line: { color: colour, width: 2, dash: options.dash },
      hovertemplate: `%{y:.4g} at %{x}<extra>${name} (${seeds})</extra>`,
      meta: { kind: "mean", preset: group.preset, line: group.line, staleness: group.staleness },
    });
    return traces;
  }

  // Every chart keeps its title, tick labels and legend inside its box and apart: the axes make
  // room for their labels (automargin), the title sits in the top margin, and the legend below the
  // x axis's title in space of its own (the bottom margin, sized for the number of lines).
  function axisLayout(title, lines = payload.lines.length) {
    // Two short legend entries share a row; a long one (a line of several experiments) has its own.
    const long = payload.lines.some((l) => l.line.length > 24);
    const legendRows = long ? lines : Math.ceil(lines / 2);
    const height = 320 + 20 * legendRows;
    return {
      height,
      margin: { l: 60, r: 20, t: 40, b: 50 + 20 * legendRows },
      // Left-aligned with the plot, its top 8 px below the chart's.
      title: { text: escapeText(title), font: { size: 13 }, x: 0, xanchor: "left", xref: "paper", y: 1 - 8 / height, yref: "container", yanchor: "top" },
      xaxis: { title: { text: X_TITLES[payload.x] }, automargin: true },
      yaxis: { title: { text: escapeText(payload.metric) }, automargin: true },
      legend: { orientation: "h", xref: "container", x: 0, yref: "container", y: 0, yanchor: "bottom" },
    };
  }

  // One y range for every panel, so heights compare across staleness settings at a glance.
  function sharedYRange() {
    let lo = Infinity;
    let hi = -Infinity;
    for (const g of payload.groups) {
      for (const values of [g.mean, g.lo, g.hi]) {
        for (const v of values || []) {
          if (v === null) continue;
          lo = Math.min(lo, v);
          hi = Math.max(hi, v);
        }
      }
    }
    if (!Number.isFinite(lo)) return undefined;
    const pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
    return [lo - pad, hi + pad];
  }

  function drawGrid() {
    const facet = fieldOf(control("facet").value);
    const values = facet.values.map(String);
    // Every panel is in the grid before the first is drawn, so Plotly sizes each to its own column.
    const panels = values.map((value) => {
      const panel = document.createElement("div");
      panel.className = "panel";
      panel.dataset[facet.name === "staleness" ? "staleness" : "facet"] = value;
      return panel;
    });
    plots.replaceChildren(...panels);
    const range = sharedYRange();
    const inLegend = new Set();
    values.forEach((value, column) => {
      const panel = panels[column];
      const members = payload.groups.filter((g) => valueOf(g, facet.name) === value);
      const traces = members.flatMap((g) => {
        const name = nameOf(g, facet.name);
        const first = !inLegend.has(name);
        inLegend.add(name);
        return groupTraces(g, { name, showlegend: first, dash: groupDash(g) });
      });
      const layout = axisLayout(`${facet.label}: ${value}`, new Set(members.map((g) => nameOf(g, facet.name))).size);
      layout.yaxis.range = range;
      Plotly.newPlot(panel, traces, layout, plotConfig(`${facet.label}-${value}`));
    });
  }

  function experimentDash(group) {
    return DASHES[payload.experiments.findIndex((e) => e.id === group.experiment) % DASHES.length];
  }

  // A line's dash where colours are presets': its experiment's with runs of several, else its variant's.
  function lineDash(line) {
    if (payload.experiments.length > 1) return experimentDash(line);
    const variants = [...new Set(payload.lines.map((l) => l.variant_label))];
    return DASHES[variants.indexOf(line.variant_label) % DASHES.length];
  }

  // A curve's dash: its line's while colours are presets', else its preset's (the colours tell the
  // chosen field apart, the dashes the presets).
  function groupDash(group) {
    if (control("colour").value === "preset") return lineDash(group);
    return DASHES[payload.presets.indexOf(group.preset) % DASHES.length];
  }

  function drawOverlay() {
    plots.replaceChildren();
    const panel = document.createElement("div");
    panel.className = "panel overlay";
    plots.append(panel);
    const traces = payload.groups.flatMap((g) =>
      groupTraces(g, { name: nameOf(g, ""), showlegend: true, dash: DASHES[payload.staleness.indexOf(g.staleness) % DASHES.length] }),
    );
    const overlay = axisLayout("all presets × staleness", payload.groups.length);
    Plotly.newPlot(panel, traces, { ...overlay, height: overlay.height + 160 }, plotConfig("overlay"));
  }

  function formatValue(v) {
    return v === null ? "–" : Number(v).toPrecision(4);
  }

  // A bracket always says what it is: a 95% bootstrap CI from min_ci_seeds seeds on, the seeds'
  // min–max below that (a bootstrap over 2–4 values is little more than their range), nothing for one.
  function bracket(row, digits) {
    const f = digits ? (v) => (v >= 0 ? "+" : "") + Number(v).toFixed(digits) : formatValue;
    if (row.n_seeds === 0) return "–";
    if (row.interval === null || row.lo === null) return `${f(row.value)} · 1 seed, no interval`;
    const bounds = `${f(row.value)} [${f(row.lo)}, ${f(row.hi)}]`;
    if (row.interval === "min–max") return `${bounds} min–max · ${row.n_seeds} seeds, no CI below ${payload.min_ci_seeds}`;
    return `${bounds} 95% bootstrap CI · ${row.n_seeds} seeds`;
  }

  // What a tolerance or a rank rests on: the fewest seed pairs of its drops, and whether they had CIs.
  function restsOn(row) {
    if (!row.n_seeds) return "";
    if (row.interval === "95% bootstrap CI") return ` (${row.n_seeds} seeds, CI)`;
    return ` (${row.n_seeds} seed${row.n_seeds === 1 ? "" : "s"}, ${row.interval === null ? "no interval" : "min–max, no CI"})`;
  }

  function cellRow(table, texts, header) {
    const tr = table.insertRow();
    for (const text of texts) {
      const cell = document.createElement(header ? "th" : "td");
      cell.textContent = text;
      tr.append(cell);
    }
    return tr;
  }

  // Where a line's changes are taken from, when it is not its own simulated on-policy runs.
  function baselineNote(row) {
    const { staleness, experiment } = row.baseline;
    if (experiment !== row.experiment) return ` (baseline: ${staleness} runs of #${experiment})`;
    return staleness === "on-policy" ? "" : ` (baseline: ${staleness})`;
  }

  // The final value's own noise beside δ: one evaluation of n prompts wobbles by √(p(1 − p)/n).
  function drawEvalNoise() {
    const note = document.getElementById("eval-noise");
    const noise = payload.eval_noise;
    note.hidden = !noise;
    if (!noise) return;
    const what = noise.evaluations === 1 ? `One evaluation of ${noise.eval_size} prompts` : `The mean of ${noise.evaluations} evaluations of ${noise.eval_size} prompts`;
    const text = `${what} at accuracy ${noise.accuracy.toFixed(2)} has a standard error of about ${noise.standard_error.toFixed(3)}, ${noise.exceeds_delta ? "more" : "less"} than δ = ${payload.delta}`;
    note.className = noise.exceeds_delta ? "warning" : "helptext";
    if (!noise.exceeds_delta) {
      note.textContent = `${text}.`;
      return;
    }
    const smoother = (rule) => {
      const url = new URL(window.location.href);
      url.searchParams.set("rule", rule);
      const link = document.createElement("a");
      link.href = url.toString();
      link.textContent = rule === "auc" ? "the AUC" : "the mean of the last k";
      return link;
    };
    note.replaceChildren(`${text}: one run's final value cannot resolve δ; more seeds, or a smoother rule: `, smoother("mean_last_k"), " or ", smoother("auc"), ".");
  }

  function drawStalenessAnswer() {
    drawEvalNoise();
    const stale = payload.staleness.filter((s) => payload.drops.some((d) => d.staleness === s));
    const table = document.getElementById("drops");
    table.replaceChildren();
    cellRow(table, [`change from on-policy (paired by seed)`, ...stale, "mean change", "worst change", `tolerance (δ = ${payload.delta})`, "rank"], true);
    const drops = new Map(payload.drops.map((r) => [`${r.line}\u0000${r.staleness}`, r]));
    const digits = payload.digits;
    // An answer card stays compact: when every change rests on as many seed pairs with the same kind
    // of interval (the usual sweep), the caption says so once and the cells show the numbers alone.
    const kinds = new Set([...payload.drops, ...payload.robustness].filter((r) => r.n_seeds).map((r) => `${r.n_seeds}\u0000${r.interval}`));
    const common = kinds.size === 1 && payload.drops.length ? payload.drops.find((r) => r.n_seeds) : null;
    const caption = table.createCaption();
    caption.textContent = common ? `Every change and verdict below rests on ${common.n_seeds} seed pair${common.n_seeds === 1 ? "" : "s"}: ${common.interval === null ? "no interval" : common.interval === "min–max" ? `their min–max, no CI below ${payload.min_ci_seeds}` : "95% bootstrap CIs"}.` : "";
    caption.hidden = !common;
    const cellText = (r) => {
      if (!common || !r.n_seeds || r.interval === null || r.lo === null) return bracket(r, digits);
      const f = (v) => (v >= 0 ? "+" : "") + Number(v).toFixed(digits);
      return `${f(r.value)} [${f(r.lo)}, ${f(r.hi)}]`;
    };
    const rests = (row) => (common ? "" : restsOn(row));
    for (const row of payload.robustness) {
      const cells = stale.map((s) => (drops.has(`${row.line}\u0000${s}`) ? cellText(drops.get(`${row.line}\u0000${s}`)) : ""));
      const mean = row.mean_drop === null ? "–" : row.mean_drop.toFixed(digits);
      const worst = row.worst_drop === null ? "–" : row.worst_drop.toFixed(digits);
      const tolerance = row.tolerance === null ? "–" : row.tolerance + rests(row);
      const tied = row.rank !== null && payload.robustness.filter((r) => r.experiment === row.experiment && r.rank === row.rank).length > 1;
      const rank = row.rank === null ? "not ranked" : `${row.rank}${tied ? " (tied)" : ""}${rests(row)}`;
      const tr = cellRow(table, [row.line + baselineNote(row), ...cells, mean, worst, tolerance, rank]);
      tr.dataset.preset = row.preset;
      tr.dataset.line = row.line;
    }
    const ties = document.getElementById("ties");
    const none = document.createElement("li");
    none.textContent = "None: at every setting, every two presets' difference has an interval clear of 0.";
    ties.replaceChildren(
      ...(payload.ties.length || payload.lines.length < 2 ? [] : [none]),
      ...payload.ties.map((t) => {
        const li = document.createElement("li");
        const need = t.seeds_needed === null ? "cannot tell with these data" : `about ${t.seeds_needed} seeds per preset would tell it from 0 (two-sided α 0.05, power 0.8)`;
        const variant = t.variant ? ` (${t.variant})` : "";
        li.textContent = `${t.b} − ${t.a} at ${t.staleness}${variant}: ${bracket(t, payload.digits)}: cannot be told apart; ${need}`;
        return li;
      }),
    );
    const findings = document.getElementById("findings");
    findings.replaceChildren(
      ...payload.findings.map((f) => {
        const li = document.createElement("li");
        li.dataset.verdict = f.verdict;
        li.dataset.provisional = f.provisional;
        const verdict = document.createElement("strong");
        verdict.textContent = f.provisional ? `${f.verdict} (provisional: ${f.runs_active} of ${f.runs} runs still going)` : f.verdict;
        const several = (payload.experiments.length > 1 ? ` (#${f.experiment})` : "") + (f.variant ? ` (${f.variant})` : "");
        const reasons = document.createElement("ul");
        reasons.className = "reasons";
        reasons.replaceChildren(
          ...f.reasons.map((text) => {
            const item = document.createElement("li");
            item.textContent = text;
            return item;
          }),
        );
        li.append(verdict, ` ${f.claim}${several} ${f.text}`, reasons);
        return li;
      }),
    );
    // One line for the templates about presets the sweep never ran, not a "missing cells" each.
    const leftOut = new Map();
    for (const f of payload.findings_left_out) leftOut.set(f.template, f);
    const skipped = document.getElementById("findings-left-out");
    skipped.hidden = leftOut.size === 0;
    skipped.textContent = leftOut.size
      ? `Not checked, as the sweep ran none of their presets: ${[...leftOut.values()].map((f) => `“${f.claim}” (needs ${f.absent.join(", ")})`).join("; ")}.`
      : "";
  }

  function drawSummary() {
    const damagedRuns = new Set((payload.damaged || []).map((d) => d.run));
    const table = document.getElementById("summary");
    table.replaceChildren();
    const head = table.insertRow();
    for (const text of [`${payload.metric}, ${payload.rule}${payload.rule === "mean_last_k" ? ` (k = ${payload.k})` : ""}`, ...payload.staleness]) {
      const th = document.createElement("th");
      th.textContent = text;
      head.append(th);
    }
    const cells = new Map(payload.summary.map((row) => [`${row.line}\u0000${row.staleness}`, row]));
    for (const { line, preset } of payload.lines) {
      const tr = table.insertRow();
      tr.dataset.preset = preset;
      tr.dataset.line = line;
      const name = tr.insertCell();
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = payload.colours[preset];
      name.append(swatch, line);
      for (const setting of payload.staleness) {
        const td = tr.insertCell();
        td.dataset.staleness = setting;
        const row = cells.get(`${line}\u0000${setting}`);
        if (!row) continue;
        const early = row.n_ended_early ? ` · ${row.n_ended_early} ended early, left out` : "";
        const unreadable = payload.runs.filter((r) => r.line === line && r.staleness === setting && damagedRuns.has(r.id)).length;
        const damaged = unreadable ? ` · ${unreadable} left out: damaged points` : "";
        if (row.n_seeds === 0) td.textContent = (row.active ? "no points yet" : row.n_ended_early ? "no finished seed" : unreadable ? "no readable points" : "no points (its runs ended without any)") + early + damaged;
        else td.textContent = bracket(row) + (row.n_active ? ` · ${row.n_active} still running (partial)` : "") + early + damaged;
        if (row.n_collapsed) {
          const flag = document.createElement("strong");
          flag.className = "collapsed";
          flag.textContent = ` · ${row.n_collapsed} collapsed`;
          td.append(flag);
        }
      }
    }
  }

  // A list of runs under its heading (hidden when empty), each linked to its page, then `describe(run)`.
  function drawRunList(id, runs, describe) {
    const box = document.getElementById(id);
    box.hidden = runs.length === 0;
    box.querySelector("ul").replaceChildren(
      ...runs.map((r) => {
        const li = document.createElement("li");
        li.dataset.run = r.id;
        const link = document.createElement("a");
        link.href = `/runs/${r.id}/`;
        link.textContent = `run ${r.id}`;
        li.append(link, ` · ${r.line} · ${r.staleness} · seed ${r.seed}: ${describe(r)}`);
        return li;
      }),
    );
  }

  // Runs whose policy collapsed (held-out accuracy fell to near zero and stayed).
  function drawCollapsed() {
    drawRunList("collapsed-runs", payload.runs.filter((r) => r.collapsed), (r) => `collapsed at step ${r.collapsed_step}, ended ${r.status}`);
  }

  // Runs that failed, were cancelled or were lost before their last step: no finished seed.
  function drawEndedEarly() {
    drawRunList("ended-early-runs", payload.runs.filter((r) => r.ended_early), (r) => `${r.status} at step ${r.progress} of ${r.steps}`);
  }

  // One trace per line over the staleness settings (a category axis): `fields.value` of the line's
  // rows (summary or throughput rows of the payload) with their CI as error bars.
  const lagOf = (s) => payload.lags[s].mean_lag;
  function lagText(s) {
    const lag = payload.lags[s];
    return lag.measured ? `measured mean lag ${lag.mean_lag.toFixed(2)}` : `mean lag ${lag.mean_lag.toFixed(2)}`;
  }

  function drawVersusStaleness(element, rows, fields, options) {
    const traces = payload.lines.map((l) => {
      const { line, preset } = l;
      const points = payload.staleness.map((s) => rows.find((r) => r.line === line && r.staleness === s));
      const value = (r) => (r ? r[fields.value] : null);
      const name = escapeText(line);
      return {
        x: payload.staleness.map(lagOf),
        y: points.map(value),
        customdata: points.map((r, i) => {
          if (!r) return "";
          const n = r[fields.n ?? "n_seeds"];
          return `${escapeText(payload.staleness[i])} (${lagText(payload.staleness[i])}) · ${r[fields.interval] ?? "no interval"} over ${n} seed${n === 1 ? "" : "s"}`;
        }),
        error_y: {
          type: "data",
          symmetric: false,
          array: points.map((r) => (r && r[fields.hi] !== null ? r[fields.hi] - r[fields.value] : null)),
          arrayminus: points.map((r) => (r && r[fields.lo] !== null ? r[fields.value] - r[fields.lo] : null)),
        },
        type: "scatter",
        mode: "lines+markers",
        name,
        line: { color: payload.colours[preset], dash: lineDash(l) },
        hovertemplate: `%{y:.4g} at %{customdata}<extra>${name}</extra>`,
        meta: { kind: options.kind, preset, line },
      };
    });
    // A chart with nothing to draw (no run measured its throughput yet) is left out, not drawn empty.
    const el = document.getElementById(element);
    el.hidden = !traces.some((t) => t.y.some((v) => v !== null && v !== undefined));
    if (el.hidden) {
      Plotly.purge(el);
      return;
    }
    // Three of these share a row: long staleness labels are tilted, and take the room they need.
    const layout = axisLayout(options.title);
    layout.margin.r = 40;
    // Each cell at the mean lag its runs trained at (an async cell's as measured), labelled by name.
    const ticks = new Map();
    for (const s of payload.staleness) ticks.set(lagOf(s), [...(ticks.get(lagOf(s)) || []), escapeText(s)]);
    layout.xaxis = {
      title: { text: "mean lag (versions behind on-policy)" },
      type: "linear",
      automargin: true,
      tickangle: -30,
      tickmode: "array",
      tickvals: [...ticks.keys()],
      ticktext: [...ticks.values()].map((names) => names.join("<br>")),
    };
    // Each line's markers a little to the side of the others', so no bracket hides another.
    layout.scattermode = "group";
    layout.scattergap = 0.7;
    layout.yaxis = { title: { text: escapeText(options.yTitle) }, rangemode: options.fromZero ? "tozero" : "normal", automargin: true };
    Plotly.newPlot(element, traces, layout, plotConfig(options.kind));
  }

  function drawTradeOff() {
    drawVersusStaleness("degradation", payload.summary, { value: "value", lo: "lo", hi: "hi", interval: "interval" }, {
      kind: "degradation",
      title: `final ${payload.metric} (${payload.rule})`,
      yTitle: payload.metric,
    });
    for (const [element, name, title, yTitle] of [
      ["throughput-steps", "steps_per_hour", "steady-state trainer steps per hour", "steps per hour"],
      ["throughput-tokens", "tokens_per_s", "steady-state tokens/s", "tokens/s"],
      ["throughput-cpu", "tokens_per_cpu_s", "tokens per CPU second", "tokens / CPU s"],
    ]) {
      const fields = { value: name, lo: `${name}_lo`, hi: `${name}_hi`, interval: `${name}_interval`, n: `${name}_n` };
      drawVersusStaleness(element, payload.throughput, fields, { kind: name, title, yTitle, fromZero: true });
    }
  }

  // The two halves of the trade-off side by side: for each distributed or async cell, the accuracy
  // it gave up against its matching simulated cell and the wall-clock it saved, paired by seed.
  function ratioText(r) {
    if (!r.n_pairs || r.value === null) return "–";
    const f = (v) => `${Number(v).toFixed(2)}×`;
    if (r.interval === null || r.lo === null) return `${f(r.value)} · 1 seed pair, no interval`;
    const kind = r.interval === "min–max" ? `min–max · ${r.n_pairs} seed pairs, no CI below ${payload.min_ci_seeds}` : `95% bootstrap CI · ${r.n_pairs} seed pairs`;
    return `${f(r.value)} [${f(r.lo)}, ${f(r.hi)}] ${kind}`;
  }

  // How many runs of a speed-up's two cells were not paired, and why.
  function leftOut(r) {
    if (!r.n_left_out) return "none";
    const why = [r.n_active ? `${r.n_active} still going` : "", r.n_ended_early ? `${r.n_ended_early} ended early` : ""].filter(Boolean);
    if (r.n_left_out > r.n_active + r.n_ended_early) why.push("contended or not measured");
    return `${r.n_left_out} (${why.join("; ")})`;
  }

  const coresText = (cores) => (cores === null || cores === undefined ? "–" : cores.toFixed(2));

  // The runs of the speed-ups' cells: the distributed or async runs and their simulated references.
  function speedupRuns(rows) {
    const cells = new Set(rows.flatMap((r) => [`${r.experiment}\u0000${r.line}\u0000${r.staleness}`, `${r.experiment}\u0000${r.line}\u0000${r.reference}`]));
    return new Set(payload.runs.filter((run) => cells.has(`${run.experiment}\u0000${run.line}\u0000${run.staleness}`)).map((run) => run.id));
  }

  function drawSpeedups() {
    const table = document.getElementById("speedups");
    table.replaceChildren();
    const rows = payload.speedups;
    document.getElementById("speedups-none").hidden = rows.length > 0;
    const card = document.getElementById("answer-speedups");
    card.hidden = rows.length === 0;
    if (!rows.length) {
      document.getElementById("speedups-contended").hidden = true;
      document.getElementById("speedup-chart").hidden = true;
      Plotly.purge("speedup-chart");
      return;
    }
    // The answer card: each cell's speed-up and what it cost in accuracy, one line each.
    const several = payload.experiments.length > 1;
    card.querySelector("ul").replaceChildren(
      ...rows.map((r) => {
        const li = document.createElement("li");
        const change = { ...r.accuracy_change, n_seeds: r.accuracy_change.n_pairs };
        const speed = r.speedup.value === null ? `no speed-up measured (runs left out: ${leftOut(r)})` : `${ratioText(r.speedup)} wall-clock`;
        li.textContent = `${r.line}${several ? ` · #${r.experiment}` : ""} ${r.staleness} vs ${r.reference}: ${speed}; ${payload.metric} change ${bracket(change, payload.digits)}`;
        li.dataset.preset = r.preset;
        return li;
      }),
    );
    // Every pair left out for contention (the default leaves contended runs out): say so first,
    // with the counted view one click away, and draw no empty chart.
    const note = document.getElementById("speedups-contended");
    const measured = payload.runs.filter((r) => speedupRuns(rows).has(r.id) && r.others_cores !== null);
    const allContended = !payload.contended && rows.every((r) => r.n_pairs === 0) && measured.length > 0 && measured.every((r) => r.contended);
    note.hidden = !allContended;
    if (allContended) {
      const cores = measured.map((r) => r.others_cores);
      const counted = new URL(window.location.href);
      counted.searchParams.set("contended", "1");
      const link = document.createElement("a");
      link.href = counted.toString();
      link.textContent = "count them anyway";
      note.replaceChildren(
        `All ${measured.length} runs of these cells ran contended: ${Math.min(...cores).toFixed(1)}–${Math.max(...cores).toFixed(1)} cores used by other processes, so no speed-up is measured (`,
        link,
        ").",
      );
    }
    cellRow(table, ["preset", "cell", "against", `${payload.metric} change`, "wall-clock speed-up", "CPU cost", "s per steady step (cell / reference)", "outside load, cores (cell / reference)", "runs left out"], true);
    for (const r of rows) {
      const seconds = r.wall_per_step_s === null ? "–" : `${r.wall_per_step_s.toPrecision(3)} / ${r.reference_wall_per_step_s.toPrecision(3)}`;
      const change = { ...r.accuracy_change, n_seeds: r.accuracy_change.n_pairs };
      const tr = cellRow(table, [
        r.line + (several ? ` · #${r.experiment}` : ""),
        r.staleness,
        `${r.reference} (${r.against})`,
        bracket(change, payload.digits),
        ratioText(r.speedup),
        ratioText(r.cpu_cost),
        seconds,
        `${coresText(r.others_cores)} / ${coresText(r.reference_others_cores)}`,
        leftOut(r),
      ]);
      tr.dataset.preset = r.preset;
      tr.dataset.staleness = r.staleness;
      tr.dataset.reference = r.reference;
    }
    const plotted = rows.filter((r) => r.speedup.value !== null && r.accuracy_change.value !== null);
    document.getElementById("speedup-chart").hidden = plotted.length === 0;
    if (!plotted.length) {
      Plotly.purge("speedup-chart");
      return;
    }
    const presets = [...new Set(plotted.map((r) => r.line))];
    const traces = presets.map((line) => {
      const preset = rows.find((r) => r.line === line).preset;
      const mine = rows.filter((r) => r.line === line && r.speedup.value !== null && r.accuracy_change.value !== null);
      const bars = (r, side, key) => (r[key][side] === null ? null : Math.abs(r[key][side] - r[key].value));
      return {
        x: mine.map((r) => r.speedup.value),
        y: mine.map((r) => r.accuracy_change.value),
        error_x: { type: "data", symmetric: false, array: mine.map((r) => bars(r, "hi", "speedup")), arrayminus: mine.map((r) => bars(r, "lo", "speedup")) },
        error_y: { type: "data", symmetric: false, array: mine.map((r) => bars(r, "hi", "accuracy_change")), arrayminus: mine.map((r) => bars(r, "lo", "accuracy_change")) },
        text: mine.map((r) => escapeText(`${r.staleness} vs ${r.reference}`)),
        hovertemplate: `%{text}: %{x:.2f}× faster, change %{y:+.3f}<extra>${escapeText(line)}</extra>`,
        type: "scatter",
        mode: "markers",
        name: escapeText(line),
        marker: { color: payload.colours[preset], size: 10, symbol: mine.map((r) => (r.against === "on-policy" ? "square" : "circle")) },
        meta: { kind: "speedup", preset },
      };
    });
    const layout = axisLayout(`accuracy lost vs time saved (circle: against the same bound, square: against on-policy)`, presets.length);
    layout.xaxis = { title: { text: "wall-clock speed-up (×, above 1: faster)" }, automargin: true };
    layout.yaxis = { title: { text: escapeText(`${payload.metric} change`) }, automargin: true, zeroline: true };
    Plotly.newPlot("speedup-chart", traces, layout, plotConfig("speedup"));
  }

  // Runs that ran contended: flagged, and left out of the throughput and the speed-ups unless counted.
  function drawContended() {
    const counted = payload.contended ? "counted (contended runs shown)" : "left out of the throughput and the speed-ups";
    drawRunList("contended-runs", payload.runs.filter((r) => r.contended), (r) => {
      const cores = r.others_cores === null ? "?" : r.others_cores.toFixed(2);
      return `other processes used ${cores} cores meanwhile; ${counted}`;
    });
  }

  function drawScatter() {
    const traces = payload.lines.map(({ line, preset }) => {
      const runs = payload.runs.filter((r) => r.line === line && r["kl/init"] !== null && r["reward/mean"] !== null);
      return {
        x: runs.map((r) => r["kl/init"]),
        y: runs.map((r) => r["reward/mean"]),
        text: runs.map((r) => escapeText(`run ${r.id} · ${r.staleness} · seed ${r.seed}`)),
        type: "scatter",
        mode: "markers",
        name: escapeText(line),
        marker: {
          color: payload.colours[preset],
          size: 9,
          symbol: runs.map((r) => SYMBOLS[payload.staleness.indexOf(r.staleness) % SYMBOLS.length]),
        },
        meta: { kind: "run", preset, line },
      };
    });
    const scatter = document.getElementById("scatter");
    scatter.hidden = !traces.some((t) => t.x.length);
    if (scatter.hidden) {
      Plotly.purge(scatter);
      return;
    }
    const key = payload.staleness.map((s, i) => `${SYMBOLS[i % SYMBOLS.length]}: ${s}`).join(" · ");
    const layout = axisLayout("last reward/mean vs last kl/init, one point per run");
    layout.xaxis = { title: { text: escapeText(`last kl/init · marker = staleness (${key})`) }, automargin: true };
    layout.yaxis = { title: { text: "reward/mean" }, automargin: true };
    Plotly.newPlot("scatter", traces, layout, plotConfig("reward-vs-kl"));
  }

  // Runs that started from different θ0 or ran different library versions, and runs left out for a
  // damaged chunk of points, said above everything.
  function drawWarnings() {
    const list = document.getElementById("provenance-warnings");
    list.replaceChildren(
      ...[...payload.warnings, ...(payload.damaged || []).map((d) => d.note)].map((text) => {
        const li = document.createElement("li");
        li.textContent = text;
        return li;
      }),
    );
  }

  // Cells that differ in one varied field only, paired by seed: that field's effect.
  function drawContrasts() {
    const box = document.getElementById("contrasts-box");
    box.hidden = payload.contrasts.length === 0;
    const table = document.getElementById("contrasts");
    table.replaceChildren();
    if (!payload.contrasts.length) return;
    cellRow(table, ["field", "change", "preset", "other fields", "staleness", `change of ${payload.metric} (paired by seed)`, `reading (δ = ${payload.delta})`], true);
    for (const r of payload.contrasts) {
      const tr = cellRow(table, [r.label, `${r.field_value} vs ${r.reference}`, r.preset, r.others || "–", r.staleness, bracket(r, payload.digits), r.state]);
      tr.dataset.field = r.field;
    }
  }

  // The tables first (the answer), painted before the charts are drawn (their pictures): a page of
  // many runs shows its numbers without waiting for Plotly. `data-filled` and `data-rendered` say
  // which view each has reached.
  let drawTicket = 0;
  function draw() {
    fillFieldControls();
    drawWarnings();
    drawSummary();
    drawCollapsed();
    drawEndedEarly();
    drawStalenessAnswer();
    drawContrasts();
    const runs = payload.runs.length;
    status.textContent = `${runs} run${runs === 1 ? "" : "s"} in ${payload.groups.length} group${payload.groups.length === 1 ? "" : "s"}${payload.active ? " · some still running, refreshing" : ""}`;
    root.dataset.filled = new URLSearchParams(state()).toString();
    const ticket = ++drawTicket;
    requestAnimationFrame(() => setTimeout(() => ticket === drawTicket && drawCharts(), 0));
  }

  function drawCharts() {
    if (control("view").value === "overlay") drawOverlay();
    else drawGrid();
    drawTradeOff();
    drawSpeedups();
    drawContended();
    drawScatter();
    document.getElementById("smooth-value").textContent = control("smooth").value;
    root.dataset.rendered = new URLSearchParams(state()).toString();
  }

  async function load() {
    clearTimeout(pollTimer);
    const query = dataQuery();
    document.getElementById("csv-curves").href = `${root.dataset.url}?${query}&format=csv`;
    document.getElementById("csv-summary").href = `${root.dataset.summaryUrl}?${query}&format=csv`;
    const response = await fetch(`${root.dataset.url}?${query}`, { credentials: "same-origin" });
    if (query !== dataQuery()) return; // a newer request is on its way
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      status.textContent = body && body.detail ? body.detail.map((d) => d.msg).join("; ") : `error ${response.status}`;
      return;
    }
    payload = await response.json();
    fetched = query;
    draw();
    // The claims' script (claims.js) fills its form from the lines and settings, and refreshes.
    root.dispatchEvent(new CustomEvent("comparison", { detail: { payload, state: state() } }));
    if (payload.active) pollTimer = setTimeout(load, POLL_MS);
  }

  form.addEventListener("input", () => {
    writeUrl();
    if (dataQuery() !== fetched) load();
    else if (payload) draw();
  });

  readUrl();
  writeUrl();
  load();
})();
