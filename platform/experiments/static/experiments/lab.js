// Behaviour every page shares; loaded by base.html (the Content-Security-Policy allows no inline scripts).

// A table marked data-sortable sorts by a column when its header is clicked (again: the other way),
// by each cell's data-sort value, else its text; numbers as numbers, blanks last. The order holds
// across live refreshes of the table.
const sortOrders = new Map(); // table id → [column, direction]

function sortTable(table) {
  const order = sortOrders.get(table.id);
  if (!order) return;
  const [column, direction] = order;
  const rows = [...table.rows].slice(1).filter((row) => row.cells.length > column);
  const key = (row) => {
    const cell = row.cells[column];
    const text = (cell.dataset.sort ?? cell.textContent).trim();
    const number = Number(text);
    return text === "" || text === "–" ? null : Number.isFinite(number) ? number : text;
  };
  rows.sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    if (x === null || y === null) return x === y ? 0 : x === null ? 1 : -1;
    return (x < y ? -1 : x > y ? 1 : 0) * direction;
  });
  for (const row of rows) row.parentElement.append(row);
  for (const [i, th] of [...table.rows[0].cells].entries()) {
    th.setAttribute("aria-sort", i === column ? (direction > 0 ? "ascending" : "descending") : "none");
  }
}

function makeSortable(root) {
  for (const table of root.querySelectorAll("table[data-sortable]")) {
    for (const [column, th] of [...table.rows[0].cells].entries()) {
      th.style.cursor = "pointer";
      th.title = "sort by this column";
      th.addEventListener("click", () => {
        const [current, direction] = sortOrders.get(table.id) ?? [];
        sortOrders.set(table.id, [column, current === column ? -direction : 1]);
        sortTable(table);
      });
    }
    sortTable(table);
  }
}

makeSortable(document);

// Re-fetch each [data-live-url] element every 2 s while its fragment says something is still active.
for (const el of document.querySelectorAll("[data-live-url]")) {
  const refresh = async () => {
    if (el.querySelector("[data-active='false']")) return;
    const response = await fetch(el.dataset.liveUrl, {credentials: "same-origin"});
    if (response.ok) {
      el.innerHTML = await response.text();
      makeSortable(el);
    }
    setTimeout(refresh, 2000);
  };
  setTimeout(refresh, 2000);
}

// A control marked data-autosubmit submits its form when it changes.
for (const control of document.querySelectorAll("[data-autosubmit]")) {
  control.addEventListener("change", () => control.form.submit());
}

// A form marked data-no-submit is driven by its page's script, never submitted.
for (const form of document.querySelectorAll("form[data-no-submit]")) {
  form.addEventListener("submit", (event) => event.preventDefault());
}
