// The runs page (templates/experiments/runs.html): tick every run shown at once, and tag the runs ticked.
document.getElementById("select-all").addEventListener("change", (event) => {
  for (const box of document.querySelectorAll("#pick input[name=runs]")) box.checked = event.target.checked;
});

// Tagging the runs ticked: their ids travel in the tag form (the check boxes belong to the compare form).
document.getElementById("tag-form").addEventListener("submit", (event) => {
  const form = event.target;
  const ticked = [...document.querySelectorAll("#pick input[name=runs]:checked")].map((box) => box.value);
  for (const old of form.querySelectorAll("input[name=runs]")) old.remove();
  for (const id of ticked) {
    const input = document.createElement("input");
    input.type = "hidden";
    input.name = "runs";
    input.value = id;
    form.append(input);
  }
});
