// rankscope report: builds the page from the JSON in #rankscope-data with plotly.js (inlined).
// Names come from clients: they reach the DOM as text only, and plotly as escaped text.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("rankscope-data").textContent);
  const app = document.getElementById("app");
  const PAGE = 64; // Gantt rows per page
  const { config, el, esc, fmt, table, when, steps, chart, charted, folded } = window.rankscope;
  const plural = (n, one, many) => (n === 1 ? one : many || one + "s");
  function fact(label, value, bad, title) {
    const node = el("div", { class: bad ? "fact bad" : "fact" }, el("b", {}, String(value)), label);
    if (title) node.title = title;
    return node;
  }

  // -- header: the experiment and when its run started, then the run and what the page holds
  const roles = D.roles.map((r) => `${r.role}: ${r.processes} process${r.processes === 1 ? "" : "es"}`);
  const header = el("header", {},
    el("h1", {}, D.title),
    el("div", { class: "id" }, (D.run ? `run ${D.run}` : "no run id") + " · rankscope report"),
    el("div", { class: "note" },
      D.steps ? `steps ${D.first_step}–${D.last_step} (${D.steps} finalized)` : "no finalized step",
      roles.length ? " · " + roles.join(" · ") : "", ` · generated ${D.generated}`));
  if ((D.runs || []).length > 1) {
    const name = (r) => r.started ? `${when(r.started)} · ${r.run.slice(-8)}` : r.run;
    const links = D.runs.map((r) => r.run === D.run ? el("b", {}, name(r)) : r.href ? el("a", { href: r.href }, name(r)) : el("span", {}, name(r)));
    header.append(el("div", { class: "note runs" }, "runs of this experiment, newest first: ", ...links.flatMap((l, i) => i ? [" · ", l] : [l])));
  }
  if ((D.rewinds || []).length) {
    header.append(el("div", { class: "note rewinds" }, D.rewinds.map((r) => `rewound to step ${r.step} (from ${r.from}): the final values are shown`).join(" · ")));
  }
  app.replaceChildren(header);

  const nav = el("nav", {});
  app.append(nav);
  function section(id, title) {
    nav.append(el("a", { href: "#" + id }, title));
    const s = el("section", { id });
    s.append(el("h2", {}, title));
    app.append(s);
    return s;
  }

  // -- the facts: stragglers first, then what went missing or was lost
  const facts = el("div", { class: "facts" });
  const st = D.status || {};
  const counts = D.anomaly_counts || {};
  const count = (n, one, many) => fact(plural(n, one, many), n, n > 0);
  facts.append(count(counts.straggler || 0, "straggler streak"));
  facts.append(count(D.missing.length, "step missing processes", "steps missing processes"));
  // a late update merged into its step left the step exact: said, not highlighted; one that could not be, is
  const unmerged = D.late_unmerged || 0;
  const lateWhat = "A late update: a process's data for a step that arrived after the sink had finalized the step. " +
    "Merged into the step, it makes the step's values its exact total again (nothing to do); not merged (the sink " +
    "no longer kept the step), the step's values lack it.";
  facts.append(fact(plural(D.late_updates, "late update") + (!D.late_updates ? "" : unmerged
    ? `, ${unmerged} not merged: values lack ${unmerged === 1 ? "it" : "them"}` : D.late_updates === 1 ? ", merged into its step" : ", all merged into their steps"),
  D.late_updates, unmerged > 0, lateWhat));
  facts.append(count(st.refused_points || 0, "refused point"));
  facts.append(count(st.spans_dropped || 0, "span dropped", "spans dropped"));
  facts.append(count(counts.nonfinite || 0, "non-finite step"));
  app.append(facts);
  // a straggler streak: the cause (who, where its time went, by how much), then its victims
  const sig = (v) => Number(v.toPrecision(4)); // 4 significant digits, as the console
  const ms = (seconds) => `${sig(seconds * 1e3)} ms`;
  function streakSteps(s) {
    const over = s.last !== null && s.last > s.first ? `steps ${s.first}–${s.last}` : `step ${s.first}`;
    return `${over} (${s.steps} step${s.steps === 1 ? "" : "s"})`;
  }
  function victims(s) {
    const waited = s.waited_s_max !== null && s.waited_s_max > 0
      ? `${s.waiting > 0 ? `${s.waiting} other${s.waiting === 1 ? "" : "s"}` : "others"} waited up to ${ms(s.waited_s_max)}` : "";
    if (s.collective) return `arrived last at ${s.collective}` + (waited ? `, ${waited}` : "");
    if (s.sync_phase) return `the others waited for it in ${s.sync_phase} (collectives unseen)`;
    return waited;
  }
  function cause(s) {
    return (s.excess_s !== null ? `+${ms(s.excess_s)}` : "") +
      (s.ratio !== null ? `${s.excess_s !== null ? " " : ""}(${sig(s.ratio)}× the others)` : "");
  }
  for (const s of D.stragglers.slice(0, 5)) {
    const how = [cause(s), victims(s)].filter((x) => x).join("; ");
    app.append(el("div", { class: "alert straggler" },
      `straggler: ${s.process}${s.phase ? ` in ${s.phase}` : ""} — ${streakSteps(s)}` + (how ? `: ${how}` : "")));
  }

  // the processes whose values of a key diverged from the others' (the outlier detector): said on
  // top, and drawn on their key's chart from their first step, where they hold the band's edge
  const outliers = D.anomalies.filter((a) => a.type === "outlier");
  for (const o of outliers.slice(0, 5)) {
    app.append(el("div", { class: "alert straggler" },
      `outlier: ${o.process} ${o.key} ${fmt(o.value)} vs the others ${fmt(o.others_mean)} ± ${fmt(o.others_std)} since step ${o.first_step}`));
  }
  function outlierTraces(key, x, points, holders) {
    const traces = [];
    for (const o of outliers.filter((a) => a.key === key)) {
      const y = points.map((p, i) => p[0] < o.first_step ? null
        : holders[i][1] === o.process ? p[4] : holders[i][0] === o.process ? p[3] : null);
      if (y.some((v) => v !== null)) {
        traces.push({ x, y, name: `${esc(o.process)} (outlier)`, mode: "lines+markers", connectgaps: false,
          line: { color: "#e08a00", width: 2 }, hovertemplate: `${esc(o.process)} %{y:.4g}<extra></extra>` });
      }
    }
    return traces;
  }

  // -- metrics: the user's keys, one section per role, each key with its cross-process spread
  const TOP_RIGHT = { orientation: "h", x: 1, xanchor: "right", y: 1.02, yanchor: "bottom", font: { size: 11 } }; // beside the title
  function seriesChart(node, title, points, holders, processes, key) {
    const x = points.map((p) => p[0]);
    const traces = [];
    // a band (min–max, median) only says something across several processes
    const hasBand = processes > 1 && points.some((p) => p[3] !== null && p[4] !== null && p[3] !== p[4]);
    if (hasBand) {
      const maxBy = holders.map((h) => esc(h[1] || "?")), minBy = holders.map((h) => esc(h[0] || "?"));
      traces.push({ x, y: points.map((p) => p[4]), name: "max", mode: "lines", line: { width: 0 }, customdata: maxBy,
        hovertemplate: "max %{y:.4g} (%{customdata})<extra></extra>", showlegend: false });
      traces.push({ x, y: points.map((p) => p[3]), name: "min–max", mode: "lines", line: { width: 0 }, fill: "tonexty",
        fillcolor: "rgba(27,95,180,0.18)", customdata: minBy, hovertemplate: "min %{y:.4g} (%{customdata})<extra></extra>" });
      traces.push({ x, y: points.map((p) => p[2]), name: "median", mode: "lines", line: { dash: "dot", width: 1, color: "#1b5fb4" },
        hovertemplate: "median %{y:.4g}<extra></extra>" });
      traces.push(...outlierTraces(key, x, points, holders));
    }
    traces.push({ x, y: points.map((p) => p[1]), name: "global", mode: points.length < 60 ? "lines+markers" : "lines",
      line: { color: "#d9482b", width: 2 }, hovertemplate: "global %{y:.4g}<extra></extra>" });
    const layout = { title: { text: esc(title), font: { size: 13 }, x: 0.01 }, height: 260, margin: { l: 55, r: 10, t: 32, b: 32 },
      hovermode: "x unified", xaxis: { title: { text: "step" }, tickformat: "d" }, legend: TOP_RIGHT, showlegend: hasBand };
    Plotly.newPlot(node, traces, layout, config).then(charted);
  }
  // charts for the keys that change, one table row each for those that never did
  function keyCharts(container, keys, processes, role) {
    const grid = el("div", { class: "grid" });
    container.append(grid);
    const flat = [];
    for (const k of keys) {
      const title = k.role ? `${k.key} (${k.role})` : k.key;
      if (k.constant) { flat.push([title, k]); continue; }
      const node = el("div", { class: "chart", "data-key": k.key, "data-role": k.role || role || "" });
      grid.append(node);
      chart(node, () => seriesChart(node, title, k.points, k.holders, k.processes === undefined ? processes : k.processes, k.key));
    }
    if (flat.length) {
      const rows = flat.map(([title, k]) => {
        const p = k.points[0];
        const spread = p[3] !== null && p[4] !== null && p[3] !== p[4] ? `${fmt(p[3])}–${fmt(p[4])}` : "";
        return [title, p[1], steps(k.points), spread];
      });
      const spreads = rows.some((r) => r[3]);
      container.append(table(["constant", "value", "over", ...(spreads ? ["across processes"] : [])],
        spreads ? rows : rows.map((r) => r.slice(0, 3)), "constants"));
    }
  }
  const userKeys = D.roles.some((r) => r.keys.length) || D.globals.length;
  if (userKeys) {
    const metrics = section("metrics", "Metrics");
    const several = D.roles.some((r) => r.processes > 1);
    metrics.append(el("p", { class: "note" },
      "Your keys, in the order they were first recorded." +
      (several ? " Each chart: the global value (red), and across the role's processes the min–max band (hover names who holds each) and the median." : "") +
      " A key that never changed is a row of the table below its role's charts." +
      (D.stride > 1 ? ` Long run: a series keeps every 2nd, 4th, … point it got (at most every ${D.stride}th), and its last.` : "")));
    const filter = el("input", { type: "search", placeholder: "filter keys" });
    metrics.append(el("div", { class: "controls" }, filter));
    filter.addEventListener("input", () => {
      const q = filter.value.toLowerCase();
      for (const node of metrics.querySelectorAll(".chart")) node.style.display = node.dataset.key.toLowerCase().includes(q) ? "" : "none";
    });
    for (const r of D.roles) {
      if (!r.keys.length) continue;
      metrics.append(el("h3", { class: "role" }, `${r.role} (${r.processes} process${r.processes === 1 ? "" : "es"})`));
      keyCharts(metrics, r.keys, r.processes, r.role);
    }
    if (D.globals.length) {
      metrics.append(el("h3", {}, "global only (no per-process values: merged upstream, or too many processes)"));
      keyCharts(metrics, D.globals, 0);
    }
    if (D.series_not_shown) metrics.append(el("p", { class: "note" }, `${D.series_not_shown} more series are not shown (limit).`));
  }

  // -- phases: rank x phase seconds per step, with a step slider; each traced block's phases over steps
  function phaseChart(node, c) {
    const palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d"];
    const traces = c.lines.map((line, i) => ({ x: line.points.map((p) => p[0]), y: line.points.map((p) => p[1]),
      customdata: line.points.map((p) => p[2]), name: esc(line.phase), mode: line.points.length < 60 ? "lines+markers" : "lines",
      line: line.phase === "total" ? { color: "#1d232b", dash: "dash", width: 1.5 } : { color: palette[i % palette.length], width: 2 },
      hovertemplate: `${esc(line.phase)}: mean %{y:.4g} s, max %{customdata:.4g} s<extra></extra>` }));
    const title = `${c.block || "traced"}: seconds per phase` + (c.role ? ` (${c.role})` : "");
    const layout = { title: { text: esc(title), font: { size: 13 }, x: 0.01 }, height: 280, margin: { l: 55, r: 10, t: 32, b: 32 },
      hovermode: "x unified", xaxis: { title: { text: "step" }, tickformat: "d" }, yaxis: { title: { text: "s" } },
      legend: TOP_RIGHT };
    Plotly.newPlot(node, traces, layout, config).then(charted);
  }
  const HEAT_MIN = 220, HEAT_BAR = 360;
  if (D.heat.length || D.phase_charts.length) {
    const phases = section("phases", "Phases");
    if (D.heat.length) {
      phases.append(el("p", { class: "note" }, "Seconds each process spent in each traced phase of a step." +
        (D.heat.some((h) => h.band > 1) ? " Many processes: each row is a band of consecutive ranks, showing its slowest." : "")));
      const slider = el("input", { type: "range", min: "0", max: String(D.heat.length - 1), value: String(D.heat.length - 1) });
      const label = el("span", {});
      phases.append(el("div", { class: "controls" }, "step", slider, label));
      const node = el("div", { class: "wide", id: "heatmap" });
      phases.append(node);
      const draw = () => {
        const h = D.heat[Number(slider.value)];
        label.textContent = `step ${h.step}`;
        // the plot at least HEAT_MIN px tall, so its colour bar (as tall as the plot, at most HEAT_BAR px) reads: a few
        // ticks, each label clear of the next, however few the rows
        const plotHeight = Math.max(HEAT_MIN, 15 * h.rows.length);
        const values = h.z.flat().filter((v) => v !== null);
        const flat = values.length && Math.min(...values) === Math.max(...values); // one value: a scale from 0 to it, not ±0.5 around it
        const trace = { type: "heatmap", z: h.z, x: h.phases.map(esc), y: h.rows.map(esc), colorscale: "YlOrRd", reversescale: true,
          ...(flat ? { zmin: 0, zmax: Math.max(values[0], 1e-9) } : {}),
          colorbar: { title: { text: "s", side: "top" }, thickness: 16, lenmode: "pixels", len: Math.min(plotHeight, HEAT_BAR),
            y: 1, yanchor: "top", nticks: 6, ticks: "outside", tickfont: { size: 11 }, outlinewidth: 0 },
          hovertemplate: "%{y} · %{x}: %{z:.4g} s<extra></extra>" };
        const layout = { height: plotHeight + 110, margin: { l: 170, r: 20, t: 20, b: 90 },
          yaxis: { autorange: "reversed", automargin: true, type: "category", dtick: 1, tickfont: { size: 10 } }, xaxis: { type: "category" } };
        Plotly.react(node, [trace], layout, config).then(charted);
      };
      slider.addEventListener("input", draw);
      draw();
    }
    if (D.phase_charts.length) {
      phases.append(el("h3", {}, "each phase over steps"));
      phases.append(el("p", { class: "note" }, "The mean over the role's processes of each phase's seconds (hover: the slowest process's)."));
      const grid = el("div", { class: "grid" });
      phases.append(grid);
      for (const c of D.phase_charts) {
        const node = el("div", { class: "chart phase", "data-block": c.block, "data-role": c.role });
        grid.append(node);
        chart(node, () => phaseChart(node, c));
      }
    }
  }

  // -- the Gantt of chosen steps
  const palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"];
  const MAX_NAMES = 24; // legend entries (plotly traces) per Gantt; rarer span names are drawn as "other"
  const nameCount = new Map();
  for (const g of D.gantt) for (const s of g.spans) nameCount.set(s.n, (nameCount.get(s.n) || 0) + 1);
  const named = new Map([...nameCount].sort((a, b) => b[1] - a[1]).slice(0, MAX_NAMES).map(([n], i) => [n, i]));
  function nameOf(name) { return named.has(name) ? name : "other"; }
  function colorOf(name) { return named.has(name) ? palette[named.get(name) % palette.length] : "#999999"; } // one color per span name everywhere
  function depthOf(spans) {
    const byId = new Map(spans.map((s) => [s.i, s]));
    const depth = new Map();
    const get = (s, n) => {
      if (depth.has(s.i)) return depth.get(s.i);
      const parent = s.u && byId.get(s.u);
      const d = parent && n < 16 ? get(parent, n + 1) + 1 : 0;
      depth.set(s.i, d);
      return d;
    };
    return (s) => get(s, 0);
  }
  // the x axis: the step's own time range where the spans around it would squeeze it (g.focus, phases.focus_of:
  // one linear scale, the spans before or after it cut at the edge and marked there), else the whole step
  function ganttAxis(g) {
    const f = g.focus;
    if (!f) return { zero: 0, low: null, high: null, title: "ms from the step's first span" };
    const width = f.to - f.from, pad = Math.max(width * 0.04, 1e-3);
    const cut = [f.before ? "◀ spans that began before it" : "", f.after ? "▶ spans that ended after it" : ""].filter((x) => x);
    return { zero: f.from, width, low: -pad, high: width + pad, edgeLow: -pad / 2, edgeHigh: width + pad / 2,
      title: `ms from the ${f.role}'s first span of the step; ${cut.join(", ")}: cut at the edge (hover for their times)` };
  }
  function ganttChart(node, g, processes) {
    const shown = new Set(processes);
    const spans = g.spans.filter((s) => shown.has(s.p));
    const axis = ganttAxis(g);
    const x0 = (v) => v - axis.zero; // ms from the axis' zero
    const clamp = (v) => (axis.low === null ? v : Math.min(axis.edgeHigh, Math.max(axis.edgeLow, v)));
    const depth = depthOf(g.spans);
    const byName = new Map();
    for (const s of spans) {
      const name = nameOf(s.n);
      if (!byName.has(name)) byName.set(name, []);
      byName.get(name).push(s);
    }
    const traces = [];
    const shallowest = (list) => list.reduce((m, s) => Math.min(m, depth(s)), Infinity);
    const parentsFirst = [...byName].sort((a, b) => shallowest(a[1]) - shallowest(b[1]));
    for (const [name, list] of parentsFirst) {
      const color = colorOf(name);
      const bars = list.filter((s) => s.d > 0), points = list.filter((s) => s.d <= 0);
      if (bars.length) traces.push({ type: "bar", orientation: "h", name: esc(name), y: bars.map((s) => esc(s.p)), x: bars.map((s) => s.d),
        base: bars.map((s) => x0(s.s)), width: bars.map((s) => Math.max(0.25, 0.8 - 0.18 * depth(s))), marker: { color },
        customdata: bars.map((s) => esc(s.n) + (s.w !== undefined ? `, waited ${fmt(s.w)} ms for the last arrival` : "")),
        hovertemplate: "%{customdata} · %{y}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>" });
      if (points.length) traces.push({ type: "scatter", mode: "markers", name: esc(name), y: points.map((s) => esc(s.p)),
        x: points.map((s) => x0(s.s)), marker: { symbol: "diamond", size: 9, color } });
    }
    // the rank that arrived last at a collective (the sink matched it across ranks): the others waited for it
    const last = spans.filter((s) => s.a);
    if (last.length) traces.push({ type: "scatter", mode: "markers", name: "last arrival", y: last.map((s) => esc(s.p)),
      x: last.map((s) => x0(s.s)), customdata: last.map((s) => esc(s.n)), marker: { symbol: "triangle-right", size: 11, color: "#d9482b" },
      hovertemplate: "last arrival at %{customdata} · %{y}<br>%{x:.3f} ms<extra></extra>" });
    const where = new Map(g.spans.map((s) => [s.i, s]));
    const arrows = [];
    for (const s of spans) {
      for (const linked of s.l || []) {
        const from = where.get(linked);
        if (from && shown.has(from.p) && arrows.length < 300) arrows.push([from, s, "#7a3db8"]);
      }
      if (s.c && s.c !== s.p && shown.has(s.c) && arrows.length < 300) arrows.push([{ p: s.c, s: s.s, d: 0 }, s, "#2b8a3e"]);
    }
    // each row with spans cut at an edge: a mark there, its spans' names and times on hover
    if (axis.low !== null) {
      for (const [side, outside, symbol, edge] of [["before", (s) => x0(s.s) < 0, "triangle-left", axis.edgeLow],
        ["after", (s) => x0(s.s + s.d) > axis.width, "triangle-right", axis.edgeHigh]]) {
        const rows = new Map();
        for (const s of spans.filter(outside)) {
          if (!rows.has(s.p)) rows.set(s.p, []);
          rows.get(s.p).push(s);
        }
        if (!rows.size) continue;
        const lists = [...rows.values()];
        const hover = lists.map((list) => list.slice(0, 6).map((s) => `${esc(s.n)}: ${fmt(x0(s.s))} to ${fmt(x0(s.s + s.d))} ms`).join("<br>") +
          (list.length > 6 ? `<br>… ${list.length - 6} more` : ""));
        // a row whose cut spans lie wholly outside has nothing drawn: its mark says what they were
        const gone = (s) => (side === "before" ? x0(s.s + s.d) <= 0 : x0(s.s) >= axis.width);
        const away = (v) => sig(Math.abs(side === "before" ? v : v - axis.width)); // ms before the step's own start, or after its end
        const label = lists.map((list) => {
          if (!list.every(gone)) return "";
          const far = side === "before" ? Math.min(...list.map((s) => x0(s.s))) : Math.max(...list.map((s) => x0(s.s + s.d)));
          const near = side === "before" ? Math.max(...list.map((s) => x0(s.s + s.d))) : Math.min(...list.map((s) => x0(s.s)));
          const what = list.length === 1 ? esc(list[0].n) : `${list.length} spans`;
          return side === "before" ? `${what}, ${away(far)}–${away(near)} ms before` : `${what}, ${away(near)}–${away(far)} ms after`;
        });
        traces.push({ type: "scatter", mode: "markers+text", name: side === "before" ? "began before (cut)" : "ended after (cut)",
          y: [...rows.keys()].map(esc), x: lists.map(() => edge), customdata: hover, text: label, cliponaxis: false,
          textposition: side === "before" ? "middle right" : "middle left", textfont: { size: 11, color: "#5b6573" },
          marker: { symbol, size: 10, color: "#5b6573" }, hovertemplate: `%{customdata}<extra>${side === "before" ? "began before the step's own spans" : "ended after them"}</extra>` });
      }
    }
    const annotations = arrows.map(([from, to, color]) => ({ x: clamp(x0(to.s)), y: esc(to.p), ax: clamp(x0(from.s + from.d)), ay: esc(from.p),
      xref: "x", yref: "y", axref: "x", ayref: "y", showarrow: true, arrowhead: 2, arrowsize: 1, arrowwidth: 1.3, arrowcolor: color, text: "" }));
    // the legend above the plot (plotly makes room for it), the axis title below: they never meet
    const xaxis = { title: { text: esc(axis.title) }, zeroline: false };
    if (axis.low !== null) Object.assign(xaxis, { range: [axis.low, axis.high], autorange: false });
    const layout = { barmode: "overlay", height: 150 + 22 * processes.length, margin: { l: 170, r: 20, t: 10, b: 50 },
      xaxis, yaxis: { type: "category", autorange: "reversed", automargin: true, categoryorder: "array", categoryarray: processes.map(esc) },
      annotations, legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" } };
    Plotly.react(node, traces, layout, config).then(charted);
  }
  if (D.gantt.length) {
    const gantt = section("gantt", "Step Gantt");
    gantt.append(el("p", { class: "note" }, "Every process's spans in a chosen step: nesting by bar height; arrows: span links " +
      "(purple, e.g. a trainer step to the generations it trained on) and calls across processes (green); a red triangle: " +
      "the rank that arrived last at a collective, the one the others waited for (hover a collective for its wait). " +
      "Where spans from before the step (a generator's rollout) or after it would squeeze it, the axis is the step's own " +
      "time range and they are cut at its edge, marked ◀ or ▶ (double-click a chart for the whole range)."));
    for (const g of D.gantt) { // one per step (phases.gantts: a step chosen for several reasons names them all)
      const f = g.focus;
      const took = f ? `${sig(f.to - f.from)} ms of the ${f.role}'s spans, ${sig(g.ms)} ms with those before or after` : `${fmt(g.ms)} ms`;
      gantt.append(el("h3", { "data-step": String(g.step) }, `step ${g.step} — ${g.why} (${took}, ${g.spans.length} spans)`));
      if (g.more) gantt.append(el("p", { class: "note" }, `${g.more} more spans of this step are not kept (limit).`));
      const rank = new Map();
      const busy = new Map();
      for (const s of g.spans) {
        rank.set(s.p, [s.o, s.r === null ? 1e12 : s.r, s.p]);
        busy.set(s.p, Math.max(busy.get(s.p) || 0, s.s + s.d));
      }
      const all = [...rank.keys()].sort((a, b) => {
        const x = rank.get(a), y = rank.get(b);
        return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] - y[1] || (x[2] < y[2] ? -1 : 1);
      });
      const node = el("div", { class: "wide gantt", "data-step": String(g.step) });
      if (all.length > PAGE) {
        const pick = el("select", {});
        pick.append(el("option", { value: "slowest" }, `the ${PAGE} that finished last`));
        for (let i = 0; i < all.length; i += PAGE) pick.append(el("option", { value: String(i) }, `${all[i]} … ${all[Math.min(all.length, i + PAGE) - 1]}`));
        const pageOf = () => pick.value === "slowest"
          ? [...all].sort((a, b) => busy.get(b) - busy.get(a)).slice(0, PAGE).sort((a, b) => all.indexOf(a) - all.indexOf(b))
          : all.slice(Number(pick.value), Number(pick.value) + PAGE);
        pick.addEventListener("change", () => ganttChart(node, g, pageOf()));
        gantt.append(el("div", { class: "controls" }, `${all.length} processes, ${PAGE} at a time:`, pick));
        gantt.append(node);
        chart(node, () => ganttChart(node, g, pageOf()));
      } else {
        gantt.append(node);
        chart(node, () => ganttChart(node, g, all));
      }
    }
  }

  // -- health: anomalies, missing processes, late data, what the sink refused
  const health = section("health", "Health");
  const LATE = ["corrected", "partial"]; // a late update's records: said under late data below
  const anomalies = D.anomalies.filter((a) => !LATE.includes(a.type));
  const kinds = Object.entries(counts).filter(([k]) => !LATE.includes(k));
  health.append(el("h3", {}, `anomalies (${kinds.map(([k, v]) => `${k}: ${v}`).join(", ") || "none"})`));
  if (D.stragglers.length) {
    health.append(el("p", { class: "note" }, "Straggler streaks: the process that held the others up, the phase its time " +
      "went to (net of collective waits), how far over the others' mean, and who waited for it: a streak is said once, " +
      "however many steps it lasts (the first 3 steps are warm-up, not judged)."));
    health.append(table(["process", "phase", "steps", "over the others", "× the others", "arrived last at", "others waited"],
      D.stragglers.map((s) => [s.process, s.phase, streakSteps(s), s.excess_s === null ? null : ms(s.excess_s), s.ratio === null ? null : sig(s.ratio),
        s.collective || "", s.sync_phase ? `in ${s.sync_phase} (collectives unseen)`
          : s.waited_s_max === null ? "" : `${s.waiting > 0 ? `${s.waiting}, ` : ""}up to ${ms(s.waited_s_max)}`]),
      "stragglers"));
  }
  const others = anomalies.filter((a) => a.type !== "straggler"); // each streak is a row above
  if (others.length) {
    const rows = others.map((a) => {
      const rest = Object.fromEntries(Object.entries(a).filter(([k]) => !["type", "step", "process", "phase", "key"].includes(k)));
      return [a.type, a.step, a.process || "", a.phase || a.key || "", rest];
    });
    health.append(table(["type", "step", "process", "phase or key", "details"], rows));
  }
  health.append(el("h3", {}, `missing processes (${D.missing.length} ${plural(D.missing.length, "step")})`));
  if (D.missing.length) health.append(table(["step", "missing", "processes"], D.missing.map((m) => [m.step, m.count, m.processes.join(", ")])));
  health.append(el("h3", { id: "late" }, `late data (${D.late_updates} ${plural(D.late_updates, "late update")})`));
  if (D.late_updates) {
    health.append(el("p", { class: unmerged ? "note alert" : "note" }, lateWhat + " " + (unmerged
      ? `${unmerged} of ${D.late_updates} could not be merged (past the sink's retain_seconds or retain_bytes): the steps marked "no" below lack that data.`
      : `${D.late_updates === 1 ? "It was" : "All were"} merged: the values shown are the steps' exact totals.`)));
  }
  if (D.late.length) health.append(table(["step", "late updates", "from", "merged into the step"], D.late.map((l) => [l.step, l.updates,
    (l.processes || []).join(", "), l.merged === undefined ? "" : l.merged ? "yes" : "no"]), "late"));
  const statusRows = Object.entries(st).map(([k, v]) => [k, v]);
  health.append(el("h3", {}, "the sink's counts"));
  if (statusRows.length) health.append(table(["count", "value"], statusRows));
  else health.append(el("p", { class: "note" }, "not asked of the sink (a page rebuilt from the file alone)"));
  if (D.skipped_events) health.append(el("p", { class: "note" }, `${D.skipped_events} malformed lines of the report data were skipped.`));

  // -- samples
  if (D.samples.length) {
    const samples = section("samples", "Samples");
    for (const t of D.samples) {
      samples.append(el("h3", {}, t.table));
      const pick = el("select", {});
      t.steps.forEach((s, i) => pick.append(el("option", { value: String(i) }, `step ${s.step}${s.late ? " (late)" : ""}`)));
      pick.value = String(t.steps.length - 1);
      const holder = el("div", {});
      const draw = () => {
        const s = t.steps[Number(pick.value)];
        const cols = [...new Set(s.rows.flatMap((r) => Object.keys(r.row)))];
        holder.replaceChildren(table([...cols, "side", "process", "policy version", "trace"],
          s.rows.map((r) => [...cols.map((c) => r.row[c]), r.side, r.process, r.policy_version, r.trace_id])));
      };
      pick.addEventListener("change", draw);
      samples.append(el("div", { class: "controls" }, "step", pick), holder);
      draw();
    }
  }
  // -- internals: rankscope's own keys (rl/*, rankscope/*, the straggler detector's), folded
  if (D.internals.length) {
    const internals = section("internals", "Internals");
    internals.append(folded(`rankscope's own keys (${D.internals.length}): what instrumentors record (comm/*, optimizer/*, ...), rl/*, rankscope/*, the straggler detector's per phase and collective (late rank over the others, the longest wait)`,
      (body) => keyCharts(body, D.internals, 0)));
  }
  charted();
  document.body.dataset.ready = "1";
})();
