// Relay dashboard: copy buttons, and the delivery-health card kept fresh.
// Served from /static/dashboard.js (the CSP allows no inline script). The
// pages work without it: each <button data-copy="ID" hidden> stays hidden
// until this script shows it, and a click copies the text of the element
// with id ID; the health card shows the figures of the page load.
"use strict";

// Delivery health: every 5 s (while the tab is visible) the card reads its
// data-source, the owner's JSON route, and rewrites its cells.
(function () {
  const card = document.getElementById("health");
  if (!card || !card.dataset.source) return;
  const EVERY_MS = 5000;
  const cells = {
    emits: "emits", deliveries: "deliveries", dropped: "dropped", slow: "slowConsumersClosed",
    "channel-429": "channelRateLimited", "project-429": "projectRateLimited", "client-429": "clientEmitRateLimited",
  };
  function set(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }
  // ms shows a quantile as the server renders it: "–" with no sample.
  function ms(v) {
    if (v === null || v === undefined) return "–";
    return (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms";
  }
  async function refresh() {
    if (document.hidden) return;
    let body;
    try {
      const res = await fetch(card.dataset.source, { headers: { Accept: "application/json" } });
      if (!res.ok) return;
      body = await res.json();
    } catch (e) {
      return; // offline for a moment: the next tick tries again
    }
    set("health-connections", String(body.connections));
    for (const [window, figures] of [["minute", body.lastMinute], ["hour", body.lastHour]]) {
      for (const [cell, field] of Object.entries(cells)) set(`health-${window}-${cell}`, String(figures[field]));
      set(`health-${window}-p50`, ms(figures.latencyP50Ms));
      set(`health-${window}-p99`, ms(figures.latencyP99Ms));
    }
    set("health-at", body.at.slice(11, 19));
  }
  setInterval(refresh, EVERY_MS);
})();

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
