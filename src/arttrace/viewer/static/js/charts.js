// Charts: uPlot (vendor/uplot), one x scale of steps shared by every run drawn on it. Hovering
// a chart shows each series' value at that step in its legend.

import { h, num } from "./dom.js";

export const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d"];

export function colorOf(index) {
  return COLORS[index % COLORS.length];
}

/** A colour per policy of a run of several (its place in the run's policies), on every page. */
export const POLICY_COLORS = ["#0d9488", "#c026d3", "#ea580c", "#4f46e5", "#ca8a04", "#be123c", "#0369a1", "#4d7c0f"];

export function policyColor(policies, name) {
  const k = (policies || []).indexOf(name);
  return k < 0 ? "#6b7280" : POLICY_COLORS[k % POLICY_COLORS.length];
}

window.arttraceCharts = window.arttraceCharts || {};

let loading = null;

/** uPlot, loaded the first time a page draws a chart (the other pages never parse it). */
function uPlotLoaded() {
  if (window.uPlot) return Promise.resolve();
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = new URL("../vendor/uplot/uPlot.iife.min.js", import.meta.url).href;
      script.onload = resolve;
      script.onerror = () => reject(new Error("the charting library (uPlot) did not load"));
      document.head.append(script);
    });
  }
  return loading;
}
/** The charts on the page by name, for the browser's console (and the viewer's tests). */

/** ``series``: [{label, color, dash?, points: [[step, value], ...]}]. */
function aligned(series) {
  const steps = new Set();
  for (const s of series) for (const [x] of s.points) steps.add(x);
  const xs = [...steps].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = series.map((s) => {
    const y = new Array(xs.length).fill(null);
    for (const [x, v] of s.points) y[at.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}

function signature(series) {
  return series.map((s) => `${s.label}|${s.color}|${s.dash || ""}`).join(";");
}

export class Chart {
  constructor(name, { title, unit = "", height = 220, format = num, note = null }) {
    this.name = name;
    this.height = height;
    this.format = format;
    this.unit = unit;
    this.plot = null;
    this.sig = null;
    this.box = h("div", { class: "chart-plot", dataset: { chart: name } });
    this.el = h(
      "section",
      { class: "card chart" },
      h("h3", { text: title }),
      note ? h("p", { class: "muted small", text: note }) : null,
      this.box,
    );
    this.pending = null;
    this.resize = new ResizeObserver(() => {
      const width = this.box.clientWidth;
      if (!width) return;
      if (this.pending) {
        const series = this.pending;
        this.pending = null;
        this.set(series);
      } else if (this.plot && width !== this.plot.width) {
        this.plot.setSize({ width, height: this.height });
      }
    });
    this.resize.observe(this.box);
  }

  async set(series) {
    await uPlotLoaded();
    if (!this.box.clientWidth) {
      this.pending = series; // drawn once laid out, at its width (one draw, not two)
      return;
    }
    series = series.filter((s) => s.points.length);
    if (!series.length) {
      this.destroy();
      this.box.replaceChildren(h("p", { class: "muted empty-chart", text: "no steps yet" }));
      return;
    }
    const data = aligned(series);
    const sig = signature(series);
    if (this.plot && this.sig === sig) {
      this.plot.setData(data);
      return;
    }
    this.destroy();
    this.box.replaceChildren();
    this.sig = sig;
    const format = this.format;
    const many = data[0].length;
    this.plot = new uPlot(
      {
        width: this.box.clientWidth,
        height: this.height,
        scales: { x: { time: false } },
        cursor: { drag: { x: true, y: false, setScale: true }, points: { size: 8 } },
        legend: { live: true },
        axes: [
          {
            label: "step",
            stroke: "#57606a",
            grid: { stroke: "#eef0f3" },
            ticks: { stroke: "#d0d7de" },
            incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
            values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? v : "")),
          },
          {
            stroke: "#57606a",
            size: 64,
            grid: { stroke: "#eef0f3" },
            ticks: { stroke: "#d0d7de" },
            values: (u, splits) => splits.map((v) => num(v, 3)),
          },
        ],
        series: [
          { label: "step", value: (u, v) => (v === null || v === undefined ? "—" : v) },
          ...series.map((s) => ({
            label: s.label,
            stroke: s.color,
            width: 2,
            dash: s.dash,
            spanGaps: !!s.gaps,
            points: { show: s.dots || many <= 60, size: 5, fill: s.color },
            value: (u, v) => (v === null || v === undefined ? "—" : format(v)),
          })),
        ],
      },
      data,
      this.box,
    );
    window.arttraceCharts[this.name] = this.plot;
  }

  close() {
    this.destroy();
    this.resize.disconnect();
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.sig = null;
    delete window.arttraceCharts[this.name];
  }
}
