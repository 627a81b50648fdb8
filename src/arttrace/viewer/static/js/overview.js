// The overview: every folder's steps on the same charts (one colour per folder), and each
// folder's steps as a table that leads to the step's groups.

import { get } from "./api.js";
import { Chart, colorOf, policyColor } from "./charts.js";
import { fill, h, num, pager, policyTag, problemBox, seconds, table } from "./dom.js";

const PAGE = 25;
const KINDS = { trainer: "a Trainer's run", gateway: "a gateway's journal", saved: "saved trajectories" };
let chosenMetric = null;

function pairs(xs, ys) {
  const out = [];
  for (let i = 0; i < xs.length; i++) if (ys && ys[i] !== null && ys[i] !== undefined) out.push([xs[i], ys[i]]);
  return out;
}

function dropped(data) {
  const total = data.steps.groups_total, kept = data.steps.groups_kept;
  return total.map((t, i) => (t === null || kept[i] === null ? null : t - kept[i]));
}

/** Why a step's groups did not ship, from its metrics (flat, no trainable token, curriculum). */
function whyDropped(data, i) {
  const parts = [];
  const flat = data.steps.groups_dropped[i];
  const empty = data.steps.groups_without_trainable_tokens[i];
  const left = data.steps.groups_excluded_by_curriculum[i];
  if (flat) parts.push(`${flat} flat`);
  if (empty) parts.push(`${empty} with no trainable token`);
  if (left) parts.push(`${left} left out by the curriculum`);
  return parts.join(", ");
}

export async function renderOverview(box, route, app) {
  const problems = h("div", { class: "problems" });
  const reward = new Chart("reward", {
    title: "Reward per step",
    note: "mean over the step's runs (solid: training, dashed: validation; a run of several policies: a curve per policy too, in its colour); hover for values",
  });
  const tokens = new Chart("tokens", { title: "Trainable tokens shipped per step" });
  const groups = new Chart("groups", {
    title: "Groups per step",
    note: "solid: shipped to ART; dashed: dropped (the steps table says why)",
  });
  const time = new Chart("time", { title: "Time per step", format: seconds, note: "solid: rollouts; dashed: training" });
  const lag = new Chart("lag", {
    title: "Policy lag",
    note: "steps the runs' policy was behind the step that trained on them (mean)",
  });
  const metric = new Chart("metric", { title: "Metric" });
  const picker = h("select", { class: "metric-picker", "aria-label": "metric" });
  metric.el.querySelector("h3").replaceChildren("Metric ", picker);
  picker.addEventListener("change", () => {
    chosenMetric = picker.value;
    load(null);
  });
  const charts = [reward, tokens, groups, time, metric, lag];
  const tables = h("div", { class: "step-tables" });
  const chartBox = h("div", { class: "charts" }, charts.map((c) => c.el));
  const pages = new Map();
  let data = new Map();

  function ready() {
    return app.runs.filter((r) => data.has(r.index));
  }

  async function drawMetric() {
    const names = new Set();
    for (const r of ready()) for (const n of data.get(r.index).metric_names) names.add(n);
    const sorted = [...names].sort((a, b) => (a.startsWith("train/") === b.startsWith("train/") ? a.localeCompare(b) : a.startsWith("train/") ? -1 : 1));
    const shown = ready().map((r) => data.get(r.index).metric).find((m) => m);
    if (shown && !chosenMetric) chosenMetric = shown.name;
    if (picker.options.length !== sorted.length || [...picker.options].some((o, i) => o.value !== sorted[i])) {
      picker.replaceChildren(...sorted.map((n) => h("option", { value: n, text: n })));
    }
    picker.value = chosenMetric || "";
    await metric.set(
      ready().flatMap((r) => {
        const d = data.get(r.index);
        return d.metric && d.metric.name === chosenMetric
          ? [{ label: `${r.label} · ${chosenMetric}`, color: colorOf(r.index), points: pairs(d.steps.step, d.metric.values) }]
          : [];
      }),
    );
  }

  async function draw() {
    const runs = ready();
    chartBox.hidden = !runs.some((r) => data.get(r.index).steps.step.length || data.get(r.index).validation.step.length);
    const series = (pick) => runs.flatMap((r) => pick(r, data.get(r.index), colorOf(r.index)));
    const drawn = [];
    drawn.push(reward.set(
      series((r, d, color) => [
        { label: `${r.label} · train`, color, points: pairs(d.steps.step, d.steps.reward_mean) },
        { label: `${r.label} · validation`, color, dash: [6, 4], dots: true, gaps: true, points: pairs(d.validation.step, d.validation.reward_mean) },
        ...Object.entries(d.by_policy || {}).flatMap(([p, own]) => {
          const mine = policyColor(d.policies, p);
          return [
            { label: `${r.label} · ${p} · train`, color: mine, points: pairs(own.steps.step, own.steps.reward_mean) },
            { label: `${r.label} · ${p} · validation`, color: mine, dash: [6, 4], dots: true, gaps: true, points: pairs(own.validation.step, own.validation.reward_mean) },
          ];
        }),
      ]),
    ));
    drawn.push(tokens.set(series((r, d, color) => [{ label: r.label, color, points: pairs(d.steps.step, d.steps.trainable_tokens) }])));
    drawn.push(groups.set(
      series((r, d, color) => [
        { label: `${r.label} · shipped`, color, points: pairs(d.steps.step, d.steps.groups_kept) },
        { label: `${r.label} · dropped`, color, dash: [6, 4], points: pairs(d.steps.step, dropped(d)) },
      ]),
    ));
    drawn.push(time.set(
      series((r, d, color) => [
        { label: `${r.label} · rollouts`, color, points: pairs(d.steps.step, d.steps.rollout_seconds) },
        { label: `${r.label} · training`, color, dash: [6, 4], points: pairs(d.steps.step, d.steps.train_seconds) },
      ]),
    ));
    const lagged = series((r, d, color) => [{ label: r.label, color, points: pairs(d.steps.step, d.steps.off_policy_steps_mean) }]);
    lag.el.hidden = !lagged.some((s) => s.points.some(([, v]) => v > 0));
    drawn.push(lag.set(lagged), drawMetric());
    drawTables();
    await Promise.all(drawn);
  }

  function drawTables() {
    tables.replaceChildren(
      ...ready().map((r) => {
        const d = data.get(r.index);
        const n = d.steps.step.length;
        const validation = new Map(d.validation.step.map((s, i) => [s, d.validation.reward_mean[i]]));
        const own = Object.entries(d.by_policy || {});
        const perPolicy = own.length
          ? [["reward per policy", (i) => own.map(([p, o]) => h("span", { class: "policy-reward", dataset: { policy: p } }, policyTag(p, policyColor(d.policies, p)), ` ${num(o.steps.reward_mean[i], 3)} · ${num(o.steps.groups_kept[i])} of ${num(o.steps.groups_total[i])} shipped`))]]
          : [];
        const body = h("div");
        const render = () => {
          const o = pages.get(r.index) || 0;
          const rows = [...Array(n).keys()].reverse().slice(o, o + PAGE);
          fill(
            body,
            table(
              [
                ["step", (i) => String(d.steps.step[i]), "num"],
                ["reward", (i) => `${num(d.steps.reward_mean[i], 3)} ± ${num(d.steps.reward_std[i], 2)}`, "num"],
                ["validation", (i) => (validation.has(d.steps.step[i]) ? num(validation.get(d.steps.step[i]), 3) : ""), "num"],
                ...perPolicy,
                ["groups shipped", (i) => `${num(d.steps.groups_kept[i])} of ${num(d.steps.groups_total[i])}`, "num"],
                ["dropped: why", (i) => whyDropped(d, i)],
                ["trainable tokens", (i) => num(d.steps.trainable_tokens[i]), "num"],
                ["loss", (i) => num(d.steps.loss[i]), "num"],
                ["rollouts", (i) => seconds(d.steps.rollout_seconds[i]), "num"],
                ["training", (i) => seconds(d.steps.train_seconds[i]), "num"],
              ],
              rows,
              { href: (i) => `#/r/${r.index}/step/${d.steps.step[i]}`, empty: "no step has finished yet", cls: "steps" },
            ),
            n > PAGE
              ? pager(o, PAGE, n, (next) => {
                  pages.set(r.index, next);
                  render();
                })
              : null,
          );
        };
        render();
        const journal = [];
        if (!n && d.last_journal_step !== null) {
          // a gateway's journal (no metrics.jsonl): its steps are the journal's folders
          const last = Math.min(d.last_journal_step, 499);
          journal.push(
            h("p", {}, "Steps in the journal (no metrics.jsonl: no Trainer has trained from it): "),
            h("p", { class: "journal-steps" }, [...Array(last + 1).keys()].map((s) => h("a", { href: `#/r/${r.index}/step/${s}`, text: `step ${s}` }))),
          );
        }
        return h(
          "section",
          { class: "card", dataset: { run: r.index } },
          h("h3", {}, h("i", { class: "swatch", style: `background:${colorOf(r.index)}` }), `${r.label} — ${n ? "steps" : "runs"}`),
          h(
            "p",
            { class: "muted small" },
            `${r.path} (${KINDS[r.kind] || r.kind}): ${n ? `${num(d.steps_total)} steps${d.cut ? " (the first shown)" : ""}, ` : ""}${num(d.runs)} runs — `,
            h("a", { href: `#/find?run=${r.index}`, text: "find runs" }),
          ),
          d.policies && d.policies.length > 1
            ? h("p", { class: "policies small" }, "policies: ", d.policies.map((p) => policyTag(p, policyColor(d.policies, p))))
            : null,
          journal,
          n ? body : null,
        );
      }),
    );
  }

  async function load(indices) {
    problems.replaceChildren();
    const next = new Map(data);
    await Promise.all(
      app.runs.map(async (r) => {
        if (r.state !== "ready") {
          next.delete(r.index);
          return;
        }
        if (indices && !indices.includes(r.index) && next.has(r.index)) return;
        try {
          next.set(r.index, await get(`runs/${r.index}/overview`, { metric: chosenMetric }));
        } catch (error) {
          next.delete(r.index);
          problems.append(problemBox(`${r.label}: cannot be shown`, error.message, error.fix));
        }
      }),
    );
    for (const r of app.runs) {
      if (r.state === "failed" && r.problem) {
        problems.append(problemBox(`${r.label} cannot be shown`, r.problem.message, r.problem.fix));
        problems.lastChild.append(h("p", { class: "muted small", text: r.path }));
      } else if (r.state === "opening") {
        problems.append(
          h("section", { class: "card opening" }, h("h3", { text: `${r.label}: indexing…` }), h("p", { class: "muted", text: `${r.path}: the first time takes a while on a big run (${r.opening_seconds} s so far)` })),
        );
      }
    }
    data = next;
    await draw();
  }

  box.append(
    h("h1", { text: "Overview" }),
    problems,
    chartBox,
    tables,
  );
  await load(null);
  return {
    runs: "all",
    refresh: (changed) => load(changed),
    close: () => charts.forEach((c) => c.close()),
  };
}
