// The comparison page's claims: lists the claims on these runs (the experiment's, or those stated
// on exactly this selection) with their verdicts now, and states new ones from the form, on the
// metric, final value, k and δ the page's controls show. Refreshed whenever the comparison's data
// arrive (compare.js's "comparison" event: on load, on a new query, and while runs are going).
// Every name (lines, settings, titles) goes through textContent, never innerHTML.
"use strict";

(() => {
  const root = document.getElementById("compare");
  const form = document.getElementById("claim-form");
  const list = document.getElementById("claims");
  const cards = document.querySelector("#answer-claims ul");
  const errors = document.getElementById("claim-errors");
  let current = null; // the latest comparison: { payload, state }

  const target = () =>
    form.dataset.experiment ? { experiment: Number(form.dataset.experiment) } : { runs: root.dataset.runs.split(",").map(Number) };

  function listQuery() {
    return form.dataset.experiment ? `experiment=${form.dataset.experiment}` : `runs=${root.dataset.runs}`;
  }

  function options(select, values, keep) {
    const chosen = select.value;
    select.replaceChildren(...keep, ...values.map((v) => new Option(v, v)));
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  }

  function fillForm(payload) {
    const lines = payload.lines.map((l) => l.line);
    options(form.elements.x, lines, []);
    options(form.elements.y, lines, [new Option("x's own on-policy value", "")]);
    const box = document.getElementById("claim-settings");
    const ticked = new Set([...box.querySelectorAll("input:checked")].map((i) => i.value));
    box.replaceChildren(
      box.querySelector("legend"),
      ...payload.staleness.map((setting) => {
        const label = document.createElement("label");
        const input = document.createElement("input");
        input.type = "checkbox";
        input.name = "settings";
        input.value = setting;
        input.checked = ticked.has(setting);
        label.append(input, ` ${setting}`);
        label.style.minWidth = "auto";
        return label;
      }),
    );
  }

  const signed = (v) => (v > 0 ? `+${v}` : `${v}`);

  // The same two lines at the same setting may sit in "Cannot be told apart" with another seeds
  // figure: that one tells D from 0 (two-sided), a claim's tells D from its ±δ. Say so beside it.
  function tieNote(part, setting) {
    if (!current || part.estimate === null || part.estimate === undefined) return "";
    const lines = new Map(current.payload.lines.map((l) => [`${l.experiment}|${l.variant_label}|${l.preset}`, l.line]));
    const cells = [part.a, part.b].map((c) => c.slice(0, c.lastIndexOf(" × ")));
    const tie = current.payload.ties.find((t) => {
      if (t.staleness !== setting || t.seeds_needed === null) return false;
      const pair = [t.a, t.b].map((preset) => lines.get(`${t.experiment}|${t.variant}|${preset}`));
      return pair.includes(cells[0]) && pair.includes(cells[1]) && cells[0] !== cells[1];
    });
    if (!tie) return "";
    const digits = current.payload.digits;
    return `; "Cannot be told apart" says about ${tie.seeds_needed} for the same pair: that figure tells D from 0, this one from ${signed(part.seeds_threshold)}, and D = ${signed(part.estimate)} lies ${Math.abs(part.estimate).toFixed(digits)} from 0 but ${Math.abs(part.estimate - part.seeds_threshold).toFixed(digits)} from ${signed(part.seeds_threshold)}`;
  }

  function claimItem(claim) {
    const li = document.createElement("li");
    li.dataset.verdict = claim.verdict;
    li.dataset.claim = claim.id;
    const verdict = document.createElement("strong");
    verdict.textContent = claim.provisional ? `${claim.verdict} (provisional: ${claim.runs_active} of ${claim.runs_total} runs still going)` : claim.verdict;
    if (claim.runs_ended_early) verdict.textContent += ` (${claim.runs_ended_early} run${claim.runs_ended_early === 1 ? "" : "s"} ended early, left out)`;
    const link = document.createElement("a");
    link.href = `/claims/${claim.id}/`;
    link.textContent = `#${claim.id}${claim.title ? ` ${claim.title}` : ""}`;
    const about = ` ${claim.statement} On ${claim.metric} (${claim.rule}). ${claim.pre_registered ? "Pre-registered. " : ""}Stated by ${claim.author}.`;
    const rows = document.createElement("ul");
    rows.className = "reasons";
    for (const entry of claim.by_setting) {
      const item = document.createElement("li");
      const tests = entry.parts.map((p) => {
        const numbers = p.estimate === undefined || p.estimate === null ? "" : ` D = ${p.estimate} [${p.lo}, ${p.hi}], ${p.n} ${p.paired ? "seed pairs" : "seeds, unpaired"}`;
        const needed = p.seeds_needed ? `; about ${p.seeds_needed} seeds per cell would settle it (D told from ${signed(p.seeds_threshold)}, one-sided)${tieNote(p, entry.setting)}` : "";
        return `${p.label}:${numbers} → ${p.verdict}${needed}`;
      });
      item.textContent = `at ${entry.setting}: ${entry.verdict} (${tests.join("; ")})`;
      rows.append(item);
    }
    li.append(verdict, " ", link, about, rows);
    const add = addSeeds(claim);
    if (add) li.append(add);
    return li;
  }

  // Where more seeds would settle it: a link that queues them into this experiment, after a
  // confirmation page; null where none would or the runs are a selection, not an experiment.
  function addSeeds(claim) {
    const short = claim.by_setting.flatMap((e) => e.parts).filter((p) => p.seeds_needed && p.n && p.seeds_needed > p.n);
    if (!form.dataset.experiment || !short.length) return null;
    const more = Math.max(...short.map((p) => p.seeds_needed - p.n));
    const add = document.createElement("a");
    add.className = "add-seeds";
    add.href = `/experiments/${form.dataset.experiment}/seeds/?n=${more}`;
    add.textContent = `Add ${more} seed${more === 1 ? "" : "s"}…`;
    return add;
  }

  // The answer card: each claim's verdict, the seeds that would settle it, and Add seeds.
  function claimCard(claim) {
    const li = document.createElement("li");
    li.dataset.verdict = claim.verdict;
    li.dataset.claim = claim.id;
    const verdict = document.createElement("strong");
    verdict.textContent = claim.provisional ? `${claim.verdict} (provisional)` : claim.verdict;
    const link = document.createElement("a");
    link.href = `/claims/${claim.id}/`;
    link.textContent = `#${claim.id}${claim.title ? ` ${claim.title}` : ` ${claim.statement}`}`;
    li.append(verdict, " ", link);
    const needed = claim.by_setting.flatMap((e) => e.parts).map((p) => p.seeds_needed).filter(Boolean);
    if (needed.length) li.append(`: about ${Math.max(...needed)} seeds per cell would settle it`);
    const add = addSeeds(claim);
    if (add) li.append(" ", add);
    return li;
  }

  async function refresh() {
    const response = await fetch(`${form.dataset.listUrl}?${listQuery()}`, { credentials: "same-origin" });
    if (!response.ok) return;
    const { claims } = await response.json();
    const none = document.createElement("li");
    none.textContent = "No claim stated on these runs yet.";
    list.replaceChildren(...(claims.length ? claims.map(claimItem) : [none]));
    const card = document.createElement("li");
    card.textContent = "No claim stated on these runs yet: state one below.";
    cards.replaceChildren(...(claims.length ? claims.map(claimCard) : [card]));
  }

  // A poll that brought no new final value, status or run leaves the claims' verdicts as they are,
  // but while runs go on they are asked for every 15 s at least: a claim may be on another metric.
  let seen = "";
  root.addEventListener("comparison", (event) => {
    current = event.detail;
    fillForm(current.payload);
    const p = current.payload;
    const now = JSON.stringify([listQuery(), p.metric, p.rule, p.k, p.runs.map((r) => [r.id, r.status, r.final]), p.active ? Math.floor(Date.now() / 15000) : 0]);
    if (now === seen) return;
    seen = now;
    refresh();
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    const s = current ? current.state : {};
    const part = { kind: form.elements.kind.value, x: form.elements.x.value, y: form.elements.y.value };
    const body = {
      ...target(),
      parts: [part],
      settings: [...form.querySelectorAll("input[name=settings]:checked")].map((i) => i.value),
      quantifier: form.elements.quantifier.value,
      alpha: Number(form.elements.alpha.value),
      title: form.elements.title.value,
      metric: s.metric,
      rule: s.rule,
      k: Number(s.k),
      delta: Number(s.delta),
    };
    const response = await fetch(form.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": form.elements.csrfmiddlewaretoken.value },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const reply = await response.json().catch(() => ({ detail: [{ field: "", msg: `error ${response.status}` }] }));
      errors.replaceChildren(
        ...reply.detail.map((d) => {
          const li = document.createElement("li");
          li.textContent = `${d.field}: ${d.msg}`;
          return li;
        }),
      );
      return;
    }
    form.elements.title.value = "";
    await refresh();
  });
})();
