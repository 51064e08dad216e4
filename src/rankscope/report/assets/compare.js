// rankscope runs compared: builds the page from the JSON in #rankscope-data (report/compare.py).
// One colour per run on every chart; a legend entry hides its run on that chart, a box in the
// runs table on all of them.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("rankscope-data").textContent);
  const app = document.getElementById("app");
  const { config, el, esc, table, chart, charted, folded } = window.rankscope;
  const palette = ["#d9482b", "#1b5fb4", "#2b8a3e", "#b8860b", "#7a3db8", "#0e8a8a", "#c2185b", "#5d4037",
    "#546e7a", "#ef6c00", "#3949ab", "#689f38", "#8e24aa", "#00838f", "#ad1457", "#6d4c41"];
  const color = (i) => palette[i % palette.length];
  const hidden = new Set(); // runs unticked in the table

  // -- header
  app.replaceChildren(el("header", {},
    el("h1", {}, D.title),
    el("div", { class: "note" }, `generated ${D.generated}` +
      (D.runs_not_shown ? ` · ${D.runs_not_shown} older runs not shown (the newest ${D.runs.length} are)` : ""))));
  const nav = el("nav", {});
  app.append(nav);
  function section(id, title) {
    nav.append(el("a", { href: "#" + id }, title));
    const s = el("section", { id });
    s.append(el("h2", {}, title));
    app.append(s);
    return s;
  }

  // -- the runs
  const runs = section("runs", "Runs");
  runs.append(el("p", { class: "note" }, "Oldest first. Untick a run to hide it on every chart; click a run in a chart's legend to hide it there." +
    (D.config_keys.length ? " Configuration: what the run's processes said of themselves (their Resource attributes), only where the runs differ." : " The runs' configurations (their processes' Resource attributes) are the same.")));
  const rows = D.runs.map((r, i) => {
    const box = el("input", { type: "checkbox", "data-run": String(i) });
    box.checked = true;
    box.addEventListener("change", () => { if (box.checked) hidden.delete(i); else hidden.add(i); restyleRun(i); });
    const name = r.href ? el("a", { href: r.href }, r.label) : el("span", {}, r.label);
    const config = el("div", {}, ...D.config_keys.map((k) => el("div", {}, `${k}=${r.config[k] === null || r.config[k] === undefined ? "–" : r.config[k]}`)));
    const steps = r.steps ? `${r.steps} (${r.first_step}–${r.last_step})` : "0";
    return [el("label", {}, box, el("span", { class: "swatch", style: `background:${color(i)}` })), name, r.started || "–",
      r.attempts === null ? "–" : r.attempts, steps, r.status, config];
  });
  const runsTable = table(["shown", "run", "started", "attempts", "steps", "status", "config differences"], rows, "runs");
  for (const tr of runsTable.querySelectorAll("tr")) if (tr.lastChild && tr.lastChild.tagName === "TD") tr.lastChild.className = "config";
  runs.append(runsTable);

  // -- one chart per key, a line per run
  const nodes = [];
  function lineChart(node, k) {
    const traces = k.lines.map((line) => ({ x: line.points.map((p) => p[0]), y: line.points.map((p) => p[1]),
      name: esc(D.runs[line.run].label), legendgroup: String(line.run), meta: line.run,
      mode: line.points.length < 60 ? "lines+markers" : "lines", line: { color: color(line.run), width: 2 },
      visible: hidden.has(line.run) ? "legendonly" : true, hovertemplate: "%{y:.4g}<extra>%{fullData.name}</extra>" }));
    const layout = { title: { text: esc(k.title), font: { size: 13 }, x: 0.01 }, height: 300, margin: { l: 55, r: 10, t: 32, b: 90 },
      hovermode: "x unified", xaxis: { title: { text: "step" }, tickformat: "d" }, legend: { orientation: "h", y: -0.3 }, showlegend: true };
    Plotly.newPlot(node, traces, layout, config).then(charted);
  }
  function restyleRun(run) { // that run's line on every chart drawn (the others draw with the boxes as they are)
    for (const node of nodes) {
      const index = (node.data || []).findIndex((t) => t.meta === run);
      if (index >= 0) Plotly.restyle(node, { visible: hidden.has(run) ? "legendonly" : true }, [index]);
    }
  }
  function keyCharts(container, keys) {
    const grid = el("div", { class: "grid" });
    container.append(grid);
    const flat = keys.filter((k) => k.constant);
    for (const k of keys) {
      if (k.constant) continue;
      const node = el("div", { class: "chart", "data-key": k.key, "data-role": k.role });
      grid.append(node);
      nodes.push(node);
      chart(node, () => lineChart(node, k));
    }
    if (flat.length) {
      const columns = ["constant", ...D.runs.map((r) => r.label)];
      const rows = flat.map((k) => {
        const by = new Map(k.lines.map((line) => [line.run, line.points[0][1]]));
        return [k.title, ...D.runs.map((_, i) => (by.has(i) ? by.get(i) : "–"))];
      });
      container.append(table(columns, rows, "constants"));
    }
  }
  const groups = [
    ["metrics", "Metrics", "metric", "Your keys, in the order they were first recorded; a key that never changed in any run is a row of the table below."],
    ["phases", "Phases", "duration", "Seconds of each traced phase (the mean over the role's processes, and the slowest's)."],
  ];
  for (const [id, title, kind, note] of groups) {
    const keys = D.keys.filter((k) => k.kind === kind);
    if (!keys.length) continue;
    const s = section(id, title);
    s.append(el("p", { class: "note" }, note));
    keyCharts(s, keys);
  }
  const internals = D.keys.filter((k) => k.kind === "internal");
  if (internals.length) {
    const s = section("internals", "Internals");
    s.append(folded(`rankscope's own keys (${internals.length}): rl/*, rankscope/*, the straggler detector's per phase and collective (late rank over the others, the longest wait)`,
      (body) => keyCharts(body, internals)));
  }
  if (!D.keys.length) app.append(el("p", { class: "note" }, "No run has a finalized step."));
  charted();
  document.body.dataset.ready = "1";
})();
