// The new-sweep form (templates/experiments/submit.html).

// Live count of the grid: presets × staleness settings × seeds (the server re-checks on submit).
const form = document.getElementById("sweep-form");
const count = (text) => text.split(/[\s,]+/).filter(Boolean).length;
const update = () => {
  const presets = form.querySelectorAll("input[name=presets]:checked").length;
  const settings = (form.on_policy.checked ? 1 : 0) + count(form.sync_intervals.value)
    + count(form.sync_offsets.value) + (form.offline.checked ? 1 : 0);
  const runs = presets * settings * count(form.seeds.value);
  document.getElementById("grid-size").textContent = `This sweep makes ${runs} run${runs === 1 ? "" : "s"}.`;
};
form.addEventListener("input", update);
update();
// Only the chosen task kind's fields show; the server ignores the others.
const taskKind = form.elements["task.name"];
const showTaskFields = () => {
  form.querySelectorAll("[data-task-kinds]").forEach((div) => {
    div.hidden = !div.dataset.taskKinds.split(" ").includes(taskKind.value);
  });
};
taskKind.addEventListener("change", showTaskFields);
showTaskFields();
