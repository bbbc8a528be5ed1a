// QLM dashboard: polls dashboard/data (relative to this page) once a second and redraws.
// Plain DOM and hand-drawn SVG; no libraries, nothing fetched from elsewhere.
"use strict";

(function () {
  const POLL_MS = 1000;
  const WINDOW_S = 60;
  const COLORS = ["#2e90fa", "#f79009", "#12b76a", "#9e77ed", "#f04438", "#06aed4", "#667085"];
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  let last = null;

  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const pct = (r) => (r === null || r === undefined ? "–" : (100 * r).toFixed(1) + "%");
  const int = (v) => String(Math.round(v || 0));
  const secs = (s) => (s === null || s === undefined ? "–" : s < 10 ? s.toFixed(2) + " s" : s.toFixed(1) + " s");
  const clock = (t) => new Date(t * 1000).toLocaleTimeString();
  const color = (classes, name) => COLORS[Math.max(0, classes.indexOf(name)) % COLORS.length];

  function renderCards(data) {
    const box = $("cards");
    for (const name of data.classes) {
      let card = box.querySelector(`.card[data-class="${CSS.escape(name)}"]`);
      if (!card) {
        card = el("div", { class: "card", "data-class": name });
        card.append(
          el("span", { class: "name" }, name),
          el("span", { class: "ratio", "data-field": "ratio" }),
          el("div", { class: "detail" }),
        );
        const detail = card.querySelector(".detail");
        detail.append(
          el("span", { "data-field": "met" }), " of ", el("span", { "data-field": "evaluated" }),
          " met · target ", el("span", { "data-field": "target" }), el("br"),
          "queued ", el("span", { "data-field": "queue" }),
          " in ", el("span", { "data-field": "groups" }), " groups",
        );
        box.append(card);
      }
      const a = data.attainment[name];
      const ratio = card.querySelector('[data-field="ratio"]');
      ratio.textContent = pct(a.ratio);
      ratio.classList.toggle("good", a.ratio !== null && a.target !== null && a.ratio >= a.target);
      ratio.classList.toggle("bad", a.ratio !== null && a.target !== null && a.ratio < a.target);
      card.querySelector('[data-field="met"]').textContent = int(a.met);
      card.querySelector('[data-field="evaluated"]').textContent = int(a.evaluated);
      card.querySelector('[data-field="target"]').textContent = pct(a.target);
      card.querySelector('[data-field="queue"]').textContent = int(data.queue[name]);
      card.querySelector('[data-field="groups"]').textContent = int(data.groups[name]);
    }
  }

  function attainmentSeries(history, name, mode) {
    const points = [];
    for (let i = 0; i < history.length; i++) {
      const p = history[i];
      let met = (p.met || {})[name] || 0;
      let evaluated = (p.evaluated || {})[name] || 0;
      if (mode === "window") {
        let j = i;
        while (j > 0 && history[j - 1].t >= p.t - WINDOW_S) j--;
        if (j === i) continue;
        met -= (history[j].met || {})[name] || 0;
        evaluated -= (history[j].evaluated || {})[name] || 0;
      }
      if (evaluated > 0) points.push([p.t, met / evaluated]);
    }
    return points;
  }

  function lineChart(svg, series, opts) {
    svg.replaceChildren();
    const [w, h] = [800, Number(svg.getAttribute("viewBox").split(" ")[3])];
    const pad = { l: 48, r: 10, t: 10, b: 22 };
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      svg.append(el("svg:text", { x: w / 2, y: h / 2, "text-anchor": "middle" }, "no data yet"));
      return;
    }
    const t0 = Math.min(...all.map((p) => p[0]));
    const t1 = Math.max(t0 + 1, ...all.map((p) => p[0]));
    const yMax = opts.yMax !== undefined ? opts.yMax : Math.max(1, ...all.map((p) => p[1]));
    const yMin = opts.yMin !== undefined ? opts.yMin : 0;
    const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (w - pad.l - pad.r);
    const y = (v) => h - pad.b - ((v - yMin) / (yMax - yMin || 1)) * (h - pad.t - pad.b);
    for (const v of [yMin, (yMin + yMax) / 2, yMax]) {
      svg.append(el("svg:line", { class: "axis", x1: pad.l, x2: w - pad.r, y1: y(v), y2: y(v) }));
      svg.append(el("svg:text", { x: pad.l - 6, y: y(v) + 4, "text-anchor": "end" }, opts.format(v)));
    }
    svg.append(el("svg:text", { x: pad.l, y: h - 4 }, clock(t0)));
    svg.append(el("svg:text", { x: w - pad.r, y: h - 4, "text-anchor": "end" }, clock(t1)));
    for (const s of series) {
      if (s.target !== undefined && s.target !== null) {
        svg.append(el("svg:line", {
          class: "target", stroke: s.color, x1: pad.l, x2: w - pad.r, y1: y(s.target), y2: y(s.target),
        }));
      }
      if (!s.points.length) continue;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
      svg.append(el("svg:path", { class: "series", stroke: s.color, d: d.join(""), "data-class": s.name }));
    }
  }

  function legend(box, classes) {
    box.replaceChildren(...classes.map((name) => {
      const item = el("span");
      item.append(el("i", { style: `background:${color(classes, name)}` }), name);
      return item;
    }));
  }

  // The history plus the figures of this view, so that the charts end where the cards are.
  function withNow(data) {
    const history = data.history.slice();
    const lastT = history.length ? history[history.length - 1].t : -Infinity;
    if (data.generated_at_s > lastT) {
      const pick = (key) => Object.fromEntries(data.classes.map((c) => [c, data.attainment[c][key]]));
      history.push({ t: data.generated_at_s, met: pick("met"), evaluated: pick("evaluated"), queue: data.queue });
    }
    return history;
  }

  function renderCharts(data) {
    const mode = $("attainment-mode").value;
    const history = withNow(data);
    lineChart($("attainment-chart"), data.classes.map((name) => ({
      name, color: color(data.classes, name), target: data.attainment[name].target,
      points: attainmentSeries(history, name, mode),
    })), { yMin: 0, yMax: 1, format: (v) => (100 * v).toFixed(0) + "%" });
    lineChart($("queue-chart"), data.classes.map((name) => ({
      name, color: color(data.classes, name),
      points: history.map((p) => [p.t, (p.queue || {})[name] || 0]),
    })), { yMin: 0, format: (v) => String(Math.round(v)) });
    legend($("attainment-legend"), data.classes);
    legend($("queue-legend"), data.classes);
  }

  function row(cells) {
    const tr = el("tr");
    for (const [text, cls] of cells) tr.append(el("td", cls ? { class: cls } : {}, text));
    return tr;
  }

  function renderInstances(data) {
    $("instances").tBodies[0].replaceChildren(...data.instances.map((i) => {
      const tr = row([
        [i.instance_id], [i.state, "state-" + i.state], [i.model_name],
        [int(i.running), "num"], [pct(i.kv_utilization), "num"], [secs(i.busy_s), "num"],
        [int(i.swaps), "num"], [int(i.evictions), "num"],
        [i.prefix_reuse === null ? "–" : pct(i.prefix_reuse), "num prefix-reuse"],
      ]);
      tr.dataset.instance = i.instance_id;
      return tr;
    }));
  }

  function renderWaits(data) {
    const means = data.classes.flatMap((c) => [data.waits[c].predicted_mean_s, data.waits[c].actual_mean_s]);
    const top = Math.max(1e-9, ...means.filter((v) => v !== null));
    $("waits").tBodies[0].replaceChildren(...data.classes.map((c) => {
      const w = data.waits[c];
      const tr = row([
        [c], [secs(w.predicted_mean_s), "num"], [secs(w.actual_mean_s), "num"],
        [w.error_mean_s === null ? "–" : (w.error_mean_s >= 0 ? "+" : "") + secs(w.error_mean_s), "num"],
        [w.predicted_n === w.actual_n ? int(w.actual_n) : `${int(w.predicted_n)} / ${int(w.actual_n)}`, "num"],
      ]);
      const bars = el("td", { class: "bars" });
      for (const kind of ["predicted", "actual"]) {
        const v = w[kind + "_mean_s"];
        bars.append(el("span", { class: "bar " + kind, title: kind, style: `width:${v === null ? 0 : (100 * v) / top}%` }));
      }
      tr.append(bars);
      tr.dataset.class = c;
      return tr;
    }));
  }

  function renderByModel(data) {
    $("by-model").tBodies[0].replaceChildren(...data.attainment_by_model.map((m) =>
      row([[m.slo_class], [m.model_name], [int(m.met), "num"], [int(m.evaluated), "num"], [pct(m.ratio), "num"]])));
    const runs = Object.entries(data.planner.runs).filter(([, n]) => n > 0)
      .map(([status, n]) => `${status} ${int(n)}`).join(", ") || "no re-plans yet";
    $("planner").textContent = `re-plans: ${runs}; mean solve ${secs(data.planner.solve_mean_s)}`;
  }

  function renderMisses(data) {
    const misses = data.misses_by_cause || {};
    const rows = Object.entries(misses).flatMap(([c, causes]) =>
      Object.entries(causes).map(([cause, n]) => {
        const tr = row([[c], [cause], [int(n), "num"]]);
        tr.dataset.class = c;
        tr.dataset.cause = cause;
        return tr;
      }));
    if (!rows.length) rows.push(row([["no misses"], [""], [""]]));
    $("misses").tBodies[0].replaceChildren(...rows);
  }

  function renderEvents(data) {
    const items = data.events.map((e) => {
      const li = el("li", { "data-kind": e.kind });
      li.append(el("time", {}, clock(e.at_s)), `${e.kind} on ${e.instance_id}: ${e.detail}`);
      return li;
    });
    if (!items.length && data.source !== "local") {
      items.push(el("li", {}, "per-instance totals are in the Instances table"));
    }
    $("events").replaceChildren(...items);
  }

  function renderLate(late) {
    const rows = late.data.map((r) => {
      const tr = row([
        [r.id], [r.slo_class], [r.model], [r.instance_id || "–"], [r.cause],
        [secs(r.ttft_s), "num"], [secs(r.ttft_target_s), "num"], [secs(r.late_by_s), "num"],
        [r.estimated_wait_s === null ? "–" : `${secs(r.estimated_wait_s)} (${r.estimate_basis})`, "num"],
      ]);
      tr.dataset.request = r.id;
      tr.dataset.cause = r.cause;
      return tr;
    });
    if (!rows.length) rows.push(row([[`none late in the last ${late.scanned} ended`]]));
    $("late").tBodies[0].replaceChildren(...rows);
  }

  function render(data) {
    last = data;
    $("source").textContent = data.source;
    $("updated").textContent = clock(data.generated_at_s);
    renderCards(data);
    renderCharts(data);
    renderInstances(data);
    renderWaits(data);
    renderByModel(data);
    renderMisses(data);
    renderEvents(data);
    document.body.dataset.generatedAt = String(data.generated_at_s);
  }

  async function poll() {
    try {
      const response = await fetch("dashboard/data", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const late = await fetch("dashboard/late", { cache: "no-store" });
      if (!late.ok) throw new Error(`HTTP ${late.status} (late requests)`);
      render(await response.json());
      renderLate(await late.json());
      $("status").textContent = "live";
      $("status").dataset.state = "live";
    } catch (err) {
      $("status").textContent = "error: " + err.message;
      $("status").dataset.state = "error";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  $("attainment-mode").addEventListener("change", () => last && renderCharts(last));
  poll();
})();
