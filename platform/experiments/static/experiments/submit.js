// The new-sweep form (templates/experiments/submit.html).
//
// The count line says what the sweep will queue, with the values that take effect: "18 runs × 150
// steps, lr 3e-05 (defaults)". A number box holds what was typed (a text box: a number box would
// drop "sixty" and submit a blank, i.e. the default); a value that is not a number is named here at
// once and the form is not submitted until it is fixed (the server refuses it too, naming it).
"use strict";

(() => {
  const form = document.getElementById("sweep-form");
  const line = document.getElementById("grid-size");
  const problems = document.getElementById("typing-problems");
  const problemsTop = document.getElementById("typing-problems-top");
  const below = document.getElementById("typing-problems-below");
  const count = (text) => text.split(/[\s,]+/).filter(Boolean).length;
  const INTEGER = /^[+-]?\d+$/;
  const FLOAT = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

  const numberBoxes = () => [...form.querySelectorAll("input[data-number]")].filter((box) => !box.closest("[hidden]"));
  const label = (box) => form.querySelector(`label[for="${box.id}"]`)?.textContent.replace(/:$/, "") ?? box.name;

  // What a number box means now: its typed value, its default when blank, or a problem.
  function reading(box) {
    const text = box.value.trim();
    if (text === "") return { value: box.dataset.default || null, isDefault: true };
    const ok = box.dataset.number === "integer" ? INTEGER.test(text) : FLOAT.test(text);
    return ok ? { value: text, isDefault: false } : { problem: `“${text}” is not ${box.dataset.number === "integer" ? "a whole number" : "a number"}` };
  }

  // [{box, text}] of the boxes whose value cannot be read as what they hold.
  function typingProblems() {
    const found = numberBoxes().map((box) => ({ box, text: reading(box).problem })).filter((p) => p.text);
    // An input the browser itself cannot read is refused too (it would submit a blank).
    for (const el of form.querySelectorAll("input")) if (el.validity.badInput) found.push({ box: el, text: el.validationMessage });
    return found;
  }

  // Each problem marked on its box and listed at the top of the form with a link to it.
  function showProblems(found) {
    for (const el of form.querySelectorAll("input[aria-invalid]")) el.removeAttribute("aria-invalid");
    for (const { box } of found) box.setAttribute("aria-invalid", "true");
    problems.replaceChildren(
      ...found.map(({ box, text }) => {
        const li = document.createElement("li");
        const link = document.createElement("a");
        link.href = `#${box.id}`;
        link.textContent = label(box);
        li.append(link, `: ${text}`);
        return li;
      }),
    );
    problemsTop.hidden = found.length === 0;
    below.hidden = found.length === 0;
    below.textContent = found.length ? `${found.length} field${found.length === 1 ? "" : "s"} to fix first (listed at the top, marked in red).` : "";
  }

  function effective(name, words) {
    const box = form.elements[name];
    if (!box) return "";
    const r = reading(box);
    if (r.problem || r.value === null) return "";
    return `${words(r.value)}${r.isDefault ? " (default)" : ""}`;
  }

  function update() {
    const presets = form.querySelectorAll("input[name=presets]:checked").length;
    const stale = count(form.sync_intervals.value) + count(form.sync_offsets.value) + (form.offline.checked ? 1 : 0);
    const schedules = (form.on_policy.checked ? 1 : 0) + stale;
    const settings = schedules * (form.both_modes.checked ? 2 : 1) + count(form.async_bounds.value);
    // Other axes: "field: v1, v2" per line multiply the grid by their number of values.
    const axes = form.axes.value
      .split("\n")
      .filter((l) => l.includes(":"))
      .reduce((product, l) => product * Math.max(1, count(l.slice(l.indexOf(":") + 1))), 1);
    const runs = presets * settings * axes * count(form.seeds.value);
    const found = typingProblems();
    showProblems(found);
    const mode = form.elements["execution.mode"];
    if (mode && mode.value === "async" && stale > 0) {
      line.textContent = "Async runs measure their own staleness: keep the execution mode simulated or distributed and add async cells (Async bounds), or keep only On-policy and set the bound (Staleness bound).";
      return;
    }
    if (presets === 0) {
      line.textContent = "Tick at least one preset: this sweep makes no run yet.";
      return;
    }
    const values = [effective("steps", (v) => `${v} steps`), effective("optimizer.lr", (v) => `lr ${v}`)].filter(Boolean);
    const fix = found.length ? ` Fix the ${found.length === 1 ? "field" : `${found.length} fields`} marked in red first.` : "";
    line.textContent = `This sweep makes ${runs} run${runs === 1 ? "" : "s"}${values.length ? " × " + values.join(", ") : ""}.${fix}`;
  }

  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", (event) => {
    if (typingProblems().length) {
      event.preventDefault();
      update();
      problemsTop.scrollIntoView({ block: "start" });
    }
  });
  update();

  // Only the chosen task kind's fields show; the server ignores the others.
  const taskKind = form.elements["task.name"];
  const showTaskFields = () => {
    form.querySelectorAll("[data-task-kinds]").forEach((div) => {
      div.hidden = !div.dataset.taskKinds.split(" ").includes(taskKind.value);
    });
    update();
  };
  taskKind.addEventListener("change", showTaskFields);
  showTaskFields();
})();
