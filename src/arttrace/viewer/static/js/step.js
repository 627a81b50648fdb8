// A step: its groups (one per example), and a group: its runs, each with its reward and
// advantage, and whether the group shipped to ART or why not.

import { get } from "./api.js";
import { policyColor } from "./charts.js";
import { badge, h, num, policyTag, seconds, table } from "./dom.js";
import { crumbs, folder, folderPage } from "./common.js";

function shippedCell(group) {
  return group.shipped ? badge("shipped", "ok") : badge(group.why_not || "not shipped", "warn");
}

function rewardDots(rewards) {
  return h(
    "span",
    { class: "dots" },
    rewards.map((r) =>
      h("i", {
        class: r === null ? "dot none" : "dot",
        title: r === null ? "no reward (the run failed)" : num(r),
        style: r === null ? null : `--v:${Math.max(0, Math.min(1, r))}`,
      }),
    ),
  );
}

function fact(name, value) {
  return h("div", { class: "fact" }, h("span", { class: "fact-name" }, name), h("span", { class: "fact-value" }, value));
}

export async function renderStep(box, route, app) {
  const { run, step } = route;
  return folderPage(box, app, run, async () => {
    const data = await get(`runs/${run}/steps/${step}`);
    const s = data.step;
    const policies = [...new Set(data.groups.map((g) => g.policy).filter(Boolean))];
    const policyColumn = policies.length ? [["policy", (g) => (g.policy ? policyTag(g.policy, policyColor(policies, g.policy)) : "")]] : [];
    const facts = s
      ? h(
          "div",
          { class: "facts" },
          fact("reward", `${num(s.reward_mean, 3)} ± ${num(s.reward_std, 2)}`),
          fact("groups shipped", `${num(s.groups_kept)} of ${num(s.groups_total)}`),
          fact("trainable tokens", num(s.trainable_tokens)),
          fact("loss", num(s.loss)),
          fact("rollouts", seconds(s.rollout_seconds)),
          fact("training", seconds(s.train_seconds)),
          s.off_policy_steps_mean ? fact("policy lag", num(s.off_policy_steps_mean)) : null,
          policies
            .filter((p) => s.metrics[`${p}/reward_mean`] !== undefined)
            .map((p) =>
              fact(
                h("span", { class: "policy-step", dataset: { policy: p } }, "reward of ", policyTag(p, policyColor(policies, p))),
                `${num(s.metrics[`${p}/reward_mean`], 3)} · ${num(s.metrics[`${p}/groups_kept`])} of ${num(s.metrics[`${p}/groups_total`])} shipped`,
              ),
            ),
        )
      : h("p", { class: "muted", text: folder(app, run)?.kind === "gateway" ? "a gateway's journal: no Trainer has trained this step (no metrics line)" : "this step has no metrics line yet (it is running, or did not ship)" });
    return [
      crumbs(app, run, [`step ${step}`]),
      h(
        "div",
        { class: "title-row" },
        h("h1", { text: `Step ${step}` }),
        h("span", { class: "step-nav" }, step > 0 ? h("a", { href: `#/r/${run}/step/${step - 1}`, text: "← previous" }) : null, h("a", { href: `#/r/${run}/step/${step + 1}`, text: "next →" })),
      ),
      facts,
      h(
        "section",
        { class: "card" },
        h("h3", { text: `Groups (${num(data.groups_total)})` }),
        table(
          [
            ["#", (g) => String(g.position), "num"],
            ...policyColumn,
            ["example", (g) => h("code", { text: g.example_id })],
            ["runs", (g) => num(g.runs), "num"],
            ["rewards", (g) => rewardDots(g.rewards)],
            ["mean", (g) => num(g.reward_mean, 3), "num"],
            ["spread", (g) => num(g.spread, 3), "num"],
            ["trainable tokens", (g) => num(g.trainable_tokens), "num"],
            ["exceptions", (g) => (g.exceptions ? badge(String(g.exceptions), "bad") : ""), "num"],
            ["shipped", shippedCell],
          ],
          data.groups,
          { href: (g) => `#/r/${run}/step/${step}/group/${g.position}${g.policy ? `?policy=${encodeURIComponent(g.policy)}` : ""}`, empty: "no run of this step is in the journal yet", cls: "groups" },
        ),
      ),
    ];
  });
}

function advantageBar(value) {
  if (value === null || value === undefined) return "—";
  const width = Math.min(50, Math.abs(value) * 25);
  return h(
    "span",
    { class: "adv" },
    h("span", { class: "adv-track" }, h("i", { class: value < 0 ? "neg" : "pos", style: `width:${width}%;${value < 0 ? `right:50%` : `left:50%`}` })),
    h("span", { class: "adv-num", text: num(value, 3) }),
  );
}

export async function renderGroup(box, route, app) {
  const { run, step, position } = route;
  const policy = route.params.get("policy");
  return folderPage(box, app, run, async () => {
    const data = await get(`runs/${run}/steps/${step}/groups/${position}`, { policy });
    const g = data.group;
    return [
      crumbs(app, run, [`step ${step}`, `#/r/${run}/step/${step}`], [`group ${position}`]),
      h("h1", {}, "Group ", h("code", { text: g.example_id }), g.policy ? h("span", { class: "h1-sub" }, " of ", policyTag(g.policy, policyColor([g.policy], g.policy))) : null),
      h(
        "div",
        { class: "facts" },
        g.policy ? fact("policy", g.policy) : null,
        fact("runs", num(g.runs)),
        fact("reward mean", num(g.reward_mean, 3)),
        fact("spread", num(g.spread, 3)),
        fact("trainable tokens", num(g.trainable_tokens)),
        fact("shipped", shippedCell(g)),
      ),
      data.example && data.example.length
        ? h(
            "section",
            { class: "card example" },
            h("h3", { text: "The example (as the first run was prompted)" }),
            data.example.map((m) => h("div", { class: `msg ${m.role}` }, h("span", { class: "role", text: m.role }), h("div", { class: "text", text: m.text }))),
          )
        : null,
      h(
        "section",
        { class: "card" },
        h("h3", { text: "Runs" }),
        table(
          [
            ["rollout", (r) => String(r.rollout ?? "—"), "num"],
            ["reward", (r) => num(r.reward, 3), "num"],
            ["advantage", (r) => advantageBar(r.advantage)],
            ["trainable turns", (r) => num(r.trainable_turns), "num"],
            ["trainable tokens", (r) => num(r.trainable_tokens), "num"],
            ["tokens sampled", (r) => num(r.completion_tokens), "num"],
            ["calls", (r) => num(r.calls), "num"],
            ["untrainable", (r) => (r.causes || []).map((c) => badge(c, "warn"))],
            ["recorded by", (r) => (r.sources || []).join(", ")],
            ["exception", (r) => (r.exception_type ? badge(r.exception_type, "bad", r.exception_message) : "")],
            ["policy step", (r) => (r.policy_step ?? "—").toString(), "num"],
          ],
          data.runs,
          { href: (r) => `#/r/${run}/run/${r.id}`, cls: "runs" },
        ),
      ),
    ];
  });
}
