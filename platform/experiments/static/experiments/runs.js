// The runs page (templates/experiments/runs.html): tick every run shown at once.
document.getElementById("select-all").addEventListener("change", (event) => {
  for (const box of document.querySelectorAll("#pick input[name=runs]")) box.checked = event.target.checked;
});
