// Find: the runs of a folder by reward range, example id, step, split, untrainable cause,
// policy (a run of several), text (the store's full-text index) and the Ray node they ran on,
// a page at a time. The filters live in the URL.

import { get } from "./api.js";
import { colorOf, policyColor } from "./charts.js";
import { badge, fill, h, num, pager, policyTag, problemBox, table } from "./dom.js";
import { gate } from "./common.js";

const LIMIT = 50;
const FIELDS = ["run", "split", "step", "example_id", "min_reward", "max_reward", "cause", "policy", "text", "node", "order", "offset"];

function go(params) {
  const query = new URLSearchParams();
  for (const key of FIELDS) if (params[key] !== undefined && params[key] !== null && params[key] !== "") query.set(key, params[key]);
  location.hash = `#/find?${query}`;
}

export async function renderFind(box, route, app) {
  const p = Object.fromEntries(FIELDS.map((k) => [k, route.params.get(k) || ""]));
  const ready = app.runs.filter((r) => r.state === "ready");
  const runIndex = p.run !== "" ? Number(p.run) : ready.length ? ready[0].index : app.runs.length ? app.runs[0].index : 0;
  const results = h("section", { class: "card results" });
  const causeSelect = h("select", { name: "cause", "aria-label": "untrainable cause" }, h("option", { value: "", text: "any" }));
  const policySelect = h("select", { name: "policy", "aria-label": "policy" }, h("option", { value: "", text: "any" }));
  const policyLabel = h("label", { hidden: !p.policy }, "policy", policySelect);
  const input = (name, attrs = {}) => h("input", { name, value: p[name], "aria-label": name.replace("_", " "), ...attrs });
  const form = h(
    "form",
    { class: "card find-form", onsubmit: (event) => { event.preventDefault(); submit(); } },
    h(
      "div",
      { class: "fields" },
      h("label", {}, "run folder", h("select", { name: "run", "aria-label": "run folder" }, app.runs.map((r) => h("option", { value: r.index, text: r.label, selected: r.index === runIndex })))),
      h("label", {}, "split", h("select", { name: "split", "aria-label": "split" }, ["", "train", "val"].map((v) => h("option", { value: v, text: v || "any", selected: v === p.split })))),
      h("label", {}, "step", input("step", { type: "number", min: 0, step: 1, class: "short" })),
      h("label", {}, "example id", input("example_id")),
      h("label", {}, "reward from", input("min_reward", { type: "number", step: "any", class: "short" })),
      h("label", {}, "to", input("max_reward", { type: "number", step: "any", class: "short" })),
      h("label", {}, "untrainable cause", causeSelect),
      policyLabel,
      h("label", { class: "wide" }, "text", input("text", { type: "search", placeholder: "words in the messages" })),
      h("label", {}, "Ray node", input("node", { placeholder: "id or address" })),
      h("label", {}, "order", h("select", { name: "order", "aria-label": "order" }, [["step", "step"], ["-step", "step, last first"], ["-reward", "reward, high first"], ["reward", "reward, low first"], ["-id", "newest indexed first"]].map(([v, t]) => h("option", { value: v, text: t, selected: v === (p.order || "step") })))),
    ),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "primary", text: "Find" }), h("a", { href: `#/find?run=${runIndex}`, text: "clear" })),
  );

  function values() {
    const data = Object.fromEntries(new FormData(form).entries());
    return { ...data, offset: "" };
  }

  function submit() {
    go(values());
  }

  form.addEventListener("change", (event) => {
    if (event.target.name === "run" || event.target.tagName === "SELECT") submit();
  });

  async function load() {
    const blocked = gate(app, runIndex);
    if (blocked) {
      results.replaceChildren(blocked);
      return;
    }
    try {
      const offset = Number(p.offset || 0);
      const [listed, found, named] = await Promise.all([
        get(`runs/${runIndex}/causes`),
        get(`runs/${runIndex}/trajectories`, { ...p, run: null, offset, limit: LIMIT }),
        get(`runs/${runIndex}/policies`),
      ]);
      const policies = Object.keys(named.policies);
      fill(
        policySelect,
        h("option", { value: "", text: "any" }),
        Object.entries(named.policies).map(([name, n]) => h("option", { value: name, text: `${name} (${num(n)} runs)${named.frozen.includes(name) ? " · frozen" : ""}`, selected: name === p.policy })),
      );
      if (p.policy && !(p.policy in named.policies)) policySelect.append(h("option", { value: p.policy, text: `${p.policy} (0 runs)`, selected: true }));
      policyLabel.hidden = policies.length < 2 && !p.policy;
      const causes = listed.causes;
      fill(
        causeSelect,
        h("option", { value: "", text: "any" }),
        Object.entries(causes)
          .sort((a, b) => b[1] - a[1])
          .map(([cause, n]) => h("option", { value: cause, text: `${cause} (${num(n)} runs)`, selected: cause === p.cause })),
      );
      if (p.cause && !(p.cause in causes)) causeSelect.append(h("option", { value: p.cause, text: `${p.cause} (0 runs)`, selected: true }));
      fill(
        results,
        h("p", { class: "found", dataset: { total: found.total } }, h("i", { class: "swatch", style: `background:${colorOf(runIndex)}` }), h("b", { text: `${num(found.total)} run${found.total === 1 ? "" : "s"}` }), " found"),
        table(
          [
            ["step", (r) => (r.step ?? "—").toString(), "num"],
            ["group", (r) => (r.position ?? "—").toString(), "num"],
            ["rollout", (r) => (r.rollout ?? "—").toString(), "num"],
            ["split", (r) => r.split || "—"],
            ["example", (r) => h("code", { text: r.example_id })],
            ["reward", (r) => num(r.reward, 3), "num"],
            ["trainable turns", (r) => num(r.trainable_turns), "num"],
            ["trainable tokens", (r) => num(r.trainable_tokens), "num"],
            ...(found.rows.some((r) => r.policies && r.policies.length) && policies.length > 1 ? [["policies", (r) => (r.policies || []).map((name) => policyTag(name, policyColor(policies, name)))]] : []),
            ["untrainable", (r) => (r.causes || []).map((c) => badge(c, "warn"))],
            ["exception", (r) => (r.exception_type ? badge(r.exception_type, "bad", r.exception_message) : "")],
            ...(found.rows.some((r) => r.node_id) ? [["ran on", (r) => (r.node_id ? h("code", { text: `${r.node_address} pid ${r.worker_pid}`, title: `Ray node ${r.node_id}` }) : "—")]] : []),
          ],
          found.rows,
          { href: (r) => `#/r/${runIndex}/run/${r.id}`, empty: "no run matches these filters", cls: "found-runs" },
        ),
        found.total > LIMIT ? pager(offset, LIMIT, found.total, (next) => go({ ...values(), offset: next })) : null,
      );
    } catch (error) {
      results.replaceChildren(problemBox(error.status === 400 ? "These filters cannot be used" : "Cannot search this folder", error.message, error.fix));
    }
  }

  box.append(h("h1", { text: "Find runs" }), form, results);
  await load();
  return { runs: [runIndex], refresh: load };
}
