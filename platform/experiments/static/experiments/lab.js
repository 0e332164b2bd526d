// Behaviour every page shares; loaded by base.html (the Content-Security-Policy allows no inline scripts).

// Re-fetch each [data-live-url] element every 2 s while its fragment says something is still active.
for (const el of document.querySelectorAll("[data-live-url]")) {
  const refresh = async () => {
    if (el.querySelector("[data-active='false']")) return;
    const response = await fetch(el.dataset.liveUrl, {credentials: "same-origin"});
    if (response.ok) el.innerHTML = await response.text();
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
