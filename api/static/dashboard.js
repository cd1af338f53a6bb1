// Relay dashboard: copy buttons. Served from /static/dashboard.js (the CSP
// allows no inline script). The pages work without it: each
// <button data-copy="ID" hidden> stays hidden until this script shows it, and
// a click copies the text of the element with id ID.
"use strict";

(function () {
  const SHOWN_MS = 1500;

  // fallbackCopy selects the element's text and copies it the old way, for
  // pages served over plain HTTP (navigator.clipboard needs a secure context).
  function fallbackCopy(el) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    sel.removeAllRanges();
    return ok;
  }

  async function copy(el) {
    const text = el.textContent;
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        return true;
      } catch (e) {
        // Refused (no permission, document not focused): try the old way.
      }
    }
    return fallbackCopy(el);
  }

  for (const button of document.querySelectorAll("button[data-copy]")) {
    const target = document.getElementById(button.dataset.copy);
    if (!target) continue;
    const label = button.textContent;
    let timer;
    button.hidden = false;
    button.addEventListener("click", async () => {
      const ok = await copy(target);
      button.textContent = ok ? "Copied" : "Select and copy by hand";
      button.classList.toggle("copied", ok);
      clearTimeout(timer);
      timer = setTimeout(() => {
        button.textContent = label;
        button.classList.remove("copied");
      }, SHOWN_MS);
    });
  }
})();
