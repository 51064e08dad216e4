// rankscope pages (a run's report, a comparison of runs): what both scripts share.
// Names come from clients: they reach the DOM as text only, and plotly as escaped text.
"use strict";
window.rankscope = (function () {
  const EAGER = 60; // charts drawn at once; past this they are drawn when scrolled into view
  // the toolbar shows on hover only (report.css hides it otherwise, whatever plotly decides for the device)
  const config = { displaylogo: false, responsive: true, displayModeBar: "hover", showTips: false };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function esc(text) { // plotly parses a little HTML in its strings: give it entities
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(Math.round(v * 1e4) / 1e4);
  }
  function table(columns, rows, cls) {
    const t = el("table", cls ? { class: cls } : {}, el("tr", {}, ...columns.map((c) => el("th", {}, c))));
    for (const row of rows) {
      t.append(el("tr", {}, ...row.map((v) => el("td", {},
        v instanceof Node ? v : typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v)))));
    }
    return t;
  }
  function when(seconds) { // local time, to the minute, as the page's title has it
    if (seconds === null || seconds === undefined) return null;
    const d = new Date(seconds * 1000), two = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}`;
  }
  function steps(points) {
    const first = points[0][0], last = points[points.length - 1][0];
    return first === last ? `step ${first}` : `steps ${first}–${last}`;
  }

  // -- lazy charts: the first EAGER drawn at once, the rest when scrolled near
  const pending = new Map();
  let drawn = 0;
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (e.isIntersecting && pending.has(e.target)) {
        const draw = pending.get(e.target);
        pending.delete(e.target);
        observer.unobserve(e.target);
        draw();
        document.body.dataset.pending = String(pending.size);
      }
    }
  }, { rootMargin: "400px" }) : null;
  function chart(node, draw) {
    if (drawn < EAGER || !observer) { drawn += 1; draw(); } else { pending.set(node, draw); observer.observe(node); }
    document.body.dataset.pending = String(pending.size);
  }
  function charted() { document.body.dataset.charts = String(document.querySelectorAll(".js-plotly-plot").length); }

  // -- a folded part of the page: its charts are drawn when it is opened (a closed one is never
  // in view, so it does not wait to be scrolled to)
  function folded(summaryText, fill) {
    const body = el("div", {});
    const details = el("details", { class: "folded" }, el("summary", {}, summaryText), body);
    let filled = false;
    details.addEventListener("toggle", () => {
      if (details.open && !filled) { filled = true; fill(body); }
    });
    return details;
  }

  return { config, el, esc, fmt, table, when, steps, chart, charted, folded };
})();
