// Prism console: progressive enhancement only (every page works without it; the CSP allows
// no inline script). An input with data-filter="#table" hides the rows that do not contain
// what is typed, as the user types; submitting the form still searches on the server.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("input[data-filter]").forEach((input) => {
    const table = document.querySelector(input.dataset.filter);
    if (!table) return;
    input.addEventListener("input", () => {
      const needle = input.value.trim().toLowerCase();
      table.querySelectorAll("tr").forEach((row, i) => {
        if (i === 0) return;  // the header
        row.hidden = needle !== "" && !row.textContent.toLowerCase().includes(needle);
      });
    });
  });
});
