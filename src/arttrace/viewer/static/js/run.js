// A run as ART will train on it: the main conversation (ART's messages_and_choices) and the
// others (additional_histories), each message as sent, each sampled turn with its tokens:
// trainable (a Choice ART trains on) or context, shaded by logprob; hovering a token shows
// its id, its text and its logprob.

import { get } from "./api.js";
import { policyColor } from "./charts.js";
import { badge, fill, h, num, policyTag, seconds, when } from "./dom.js";
import { crumbs, folder, folderPage, tokenizerWords } from "./common.js";

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (error) {
    return text;
  }
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => (part && typeof part.text === "string" ? part.text : `[${(part && part.type) || "part"}]`))
      .join("");
  }
  return JSON.stringify(content);
}

function cutNote(message) {
  return message._cut ? h("p", { class: "muted small cut", text: `(${num(message._cut)} more characters not shown)` }) : null;
}

/** A button that puts the whole message (its text uncut) in place of ``body``'s. */
function wholeButton(message, runPath, at, label) {
  if (!message._cut) return null;
  return h("button", {
    class: "more",
    text: label,
    onclick: async (event) => {
      const full = await get(`${runPath}/items/${at[0]}/${at[1]}`, { offset: 0, limit: 1 });
      const item = event.target.closest(".msg");
      fill(item.querySelector(".msg-body"), messageBody(full.message));
      event.target.remove();
    },
  });
}

function toolCalls(calls) {
  if (!calls || !calls.length) return null;
  return h(
    "div",
    { class: "tool-calls" },
    calls.map((call) => {
      const fn = call.function || {};
      return h(
        "div",
        { class: "tool-call" },
        h("div", { class: "tool-call-head" }, badge("tool call", "tool"), h("code", { class: "tool-name", text: fn.name || "?" }), call.id ? h("span", { class: "muted small", text: call.id }) : null),
        h("pre", { class: "args", text: pretty(fn.arguments ?? "") }),
      );
    }),
  );
}

function messageBody(message) {
  const text = contentText(message.content);
  const reasoning = message.reasoning || message.reasoning_content;
  return [
    reasoning ? h("details", { class: "reasoning" }, h("summary", { text: "reasoning" }), h("div", { class: "text", text: reasoning })) : null,
    text ? h("div", { class: "text", text }) : null,
    toolCalls(message.tool_calls),
    cutNote(message),
  ];
}

function messageItem(message, runPath, at) {
  const role = message.role || "?";
  const head = [h("span", { class: "role", text: role })];
  if (role === "tool") {
    head.push(h("span", { class: "muted small", text: `result of ${message.tool_call_id || "a tool call"}${message.name ? ` (${message.name})` : ""}` }));
  }
  if (role === "assistant") head.push(h("span", { class: "muted small", text: "in the prompt, not sampled in this run: context" }));
  return h(
    "div",
    { class: `msg ${role}`, dataset: { role } },
    h("div", { class: "msg-head" }, head),
    h("div", { class: "msg-body" }, messageBody(message)),
    wholeButton(message, runPath, at, "show the whole message"),
  );
}

// -- tokens ---------------------------------------------------------------------------------

/** A token's text as a chip shows it: line breaks and tabs drawn, and a token that is only
 * spaces shown as ␣ (one per space), so no chip is blank. */
function shown(text) {
  const drawn = text.replace(/\n/g, "↵").replace(/\t/g, "→");
  return drawn.trim() === "" ? drawn.replace(/ /g, "␣") : drawn;
}

function chips(tokens, trainable, from = 0) {
  const out = [];
  const n = tokens.ids ? tokens.ids.length : tokens.logprobs ? tokens.logprobs.length : 0;
  for (let i = 0; i < n; i++) {
    const id = tokens.ids ? tokens.ids[i] : null;
    const lp = tokens.logprobs ? tokens.logprobs[i] : null;
    const text = tokens.text ? tokens.text[i] : null;
    const chip = h("span", {
      class: `tok ${trainable ? "trainable" : "context"}`,
      text: text !== null && text !== undefined ? shown(text) || "∅" : id !== null ? `#${id}` : "?",
      dataset: { i: from + i, id: id ?? "", lp: lp ?? "" },
    });
    if (lp !== null) chip.style.setProperty("--p", Math.exp(lp).toFixed(3));
    else chip.classList.add("no-lp");
    if (text !== null && text !== undefined) {
      chip.dataset.text = text;
      chip.dataset.from = tokens.text_from || "";
    }
    out.push(chip);
  }
  return out;
}

function tokenBox(turn, runPath, at) {
  const t = turn.tokens;
  const box = h("div", { class: "tokens", dataset: { trainable: turn.trainable ? "yes" : "no" } });
  if (!t.total) {
    box.append(h("p", { class: "muted small", text: "no sampled tokens recorded (the server sent no token ids or logprobs)" }));
    return box;
  }
  box.append(...chips(t, turn.trainable, t.offset));
  const got = (t.ids || t.logprobs || []).length;
  if (got < t.total) {
    const more = h("button", {
      class: "more",
      text: `show all ${num(t.total)} tokens`,
      onclick: async () => {
        more.disabled = true;
        const whole = await get(`${runPath}/items/${at[0]}/${at[1]}`, { offset: got, limit: t.total - got });
        more.replaceWith(...chips(whole.tokens, turn.trainable, got));
      },
    });
    box.append(more);
  }
  return box;
}

function turnItem(turn, runPath, at, policies) {
  const label = turn.trainable ? badge("trains · Choice", "ok", "ART trains on this turn's tokens") : badge("context · message", "ctx", "ART sees this turn as a message; its tokens are not trained on");
  const where = [turn.source, turn.framework].filter(Boolean).join(" / ");
  const head = h(
    "div",
    { class: "msg-head" },
    h("span", { class: "role", text: "assistant" }),
    label,
    turn.policy ? policyTag(turn.policy, policyColor(policies, turn.policy), "the policy this turn belongs to") : null,
    h(
      "span",
      { class: "meta" },
      h("span", { title: "finish reason", text: `finish: ${turn.finish_reason ?? "none"}` }),
      h("span", { title: "the layer that recorded the call", text: `recorded by: ${where}` }),
      turn.agent ? h("span", { title: "the @trainable function the call was made in", text: `agent: ${turn.agent}` }) : null,
      turn.framework_step ? h("span", { text: `node: ${turn.framework_step}` }) : null,
      h("span", { text: `model: ${turn.response_model || turn.model}` }),
      h("span", { text: `${num(turn.tokens.total)} tokens` }),
      turn.prompt_tokens !== null ? h("span", { text: `prompt ${num(turn.prompt_tokens)}` }) : null,
      turn.streamed ? h("span", { text: "streamed" }) : null,
    ),
  );
  const why = turn.why
    ? h("p", { class: `why ${turn.cause ? "cause" : ""}`, dataset: { cause: turn.cause || "" } }, h("strong", { text: turn.cause ? "Untrainable: " : "Context: " }), turn.cause || turn.why, turn.fix ? h("span", { class: "fix", text: ` — ${turn.fix}` }) : null)
    : null;
  const errors = [turn.error && `error: ${turn.error}`, turn.capture_error && `capture: ${turn.capture_error}`, turn.partial && "the response did not arrive whole"].filter(Boolean);
  return h(
    "div",
    {
      class: `msg assistant turn ${turn.trainable ? "trainable" : "context"}${turn.policy ? " of-policy" : ""}`,
      dataset: { role: "assistant", trainable: turn.trainable ? "yes" : "no", policy: turn.policy || "" },
      style: turn.policy ? `--c:${policyColor(policies, turn.policy)}` : null,
    },
    head,
    why,
    errors.length ? h("p", { class: "why cause", text: errors.join("; ") }) : null,
    h("div", { class: "msg-body" }, messageBody(turn.message)),
    wholeButton(turn.message, runPath, at, "show the whole turn"),
    tokenBox(turn, runPath, at),
  );
}

function conversation(c, runPath, policies) {
  const title = c.index === 0 ? "the main conversation" : "another conversation (a sub-agent, a summariser, an n > 1 branch)";
  return h(
    "section",
    { class: "card conversation", dataset: { conversation: c.index } },
    h("h3", {}, h("code", { text: c.art }), h("span", { class: "muted conv-sub", text: ` · ${title} · ${num(c.trainable_turns)} trainable turn${c.trainable_turns === 1 ? "" : "s"}` })),
    c.tools && c.tools.length
      ? h("details", { class: "tools" }, h("summary", { text: `tools: ${c.tools.map((t) => (t.function && t.function.name) || t.name || t.type).join(", ")}` }), h("pre", { class: "args", text: JSON.stringify(c.tools, null, 2) }))
      : null,
    c.items.map((item, i) => (item.kind === "turn" ? turnItem(item, runPath, [c.index, i], policies) : messageItem(item.message, runPath, [c.index, i]))),
    c.items_total > c.items.length ? h("p", { class: "muted", text: `… ${num(c.items_total - c.items.length)} more messages not shown` }) : null,
  );
}

function legend(words) {
  return h(
    "div",
    { class: "legend" },
    h("span", { class: "tok trainable", style: "--p:0.9", text: "trainable" }),
    h("span", { class: "tok context", style: "--p:0.9", text: "context" }),
    h("span", { class: "muted small", text: "darker: less likely (lower logprob); hover a token for its id, text and logprob" }),
    h("span", { class: `small tok-source ${words.state}`, text: words.long }),
  );
}

function fact(name, value) {
  return h("div", { class: "fact" }, h("span", { class: "fact-name" }, name), h("span", { class: "fact-value" }, value));
}

// -- the tooltip ----------------------------------------------------------------------------

function installTip(root, words) {
  const tip = document.getElementById("tip");
  root.addEventListener("mouseover", (event) => {
    const chip = event.target.closest(".tok[data-i]");
    if (!chip) return;
    const lp = chip.dataset.lp === "" ? null : Number(chip.dataset.lp);
    const text = chip.dataset.text;
    const from = chip.dataset.from === "tokenizer" ? " (decoded by the tokenizer)" : chip.dataset.from === "server" ? " (sent by the server)" : "";
    const missing = chip.dataset.id === "" ? "not recorded" : { ready: "not in the tokenizer's vocabulary", loading: "ids only: the tokenizer is loading" }[words().state] || "ids only: --tokenizer shows the text";
    fill(
      tip,
      h("div", {}, h("b", { text: "token id " }), h("span", { class: "tip-id", text: chip.dataset.id || "none recorded" })),
      h("div", {}, h("b", { text: "text " }), text !== undefined ? [h("code", { class: "tip-text", text: JSON.stringify(text) }), h("span", { class: "muted tip-from", text: from })] : h("span", { class: "muted", text: missing })),
      h("div", {}, h("b", { text: "logprob " }), h("span", { class: "tip-lp", text: lp === null ? "none" : String(lp) }), lp === null ? null : h("span", { class: "muted", text: ` (p = ${Math.exp(lp).toFixed(3)})` })),
      h("div", { class: "muted", text: chip.classList.contains("trainable") ? "trainable: ART trains on it" : "context: not trained on" }),
    );
    tip.hidden = false;
    const box = chip.getBoundingClientRect();
    tip.style.left = `${Math.min(window.innerWidth - 280, box.left + window.scrollX)}px`;
    tip.style.top = `${box.bottom + window.scrollY + 6}px`;
  });
  root.addEventListener("mouseout", (event) => {
    if (event.target.closest(".tok[data-i]")) tip.hidden = true;
  });
}

export async function renderRun(box, route, app) {
  const { run, id } = route;
  const words = () => tokenizerWords(folder(app, run));
  installTip(box, words);
  const page = await folderPage(box, app, run, async () => {
    const runPath = `runs/${run}/trajectories/${id}`;
    const t = await get(runPath);
    const row = t.row, group = t.group;
    const policies = t.run_policies && t.run_policies.length ? t.run_policies : t.policies;
    const several = (t.groups || []).length > 1;
    const tag = (p) => policyTag(p, policyColor(policies, p));
    const step = row && row.step !== null ? row.step : t.metadata.step; // a saved run: its own
    const trail = [];
    if (row && row.step !== null && row.step !== undefined) {
      trail.push([`step ${row.step}`, `#/r/${run}/step/${row.step}`]);
      if (group) trail.push([`group ${row.position}`, `#/r/${run}/step/${row.step}/group/${row.position}${group.policy ? `?policy=${encodeURIComponent(group.policy)}` : ""}`]);
    }
    trail.push([row && row.rollout !== null ? `rollout ${row.rollout}` : `run ${id}`]);
    const duration = t.started_at && t.ended_at ? t.ended_at - t.started_at : null;
    const exception = t.exception
      ? h(
          "section",
          { class: "problem exception", role: "alert" },
          h("h3", { text: `The run raised ${t.exception.type}` }),
          h("p", { class: "problem-message", text: t.exception.message || "(no message)" }),
          t.exception.traceback ? h("details", {}, h("summary", { text: "traceback (as journaled)" }), h("pre", { text: t.exception.traceback })) : null,
        )
      : null;
    return [
      crumbs(app, run, ...trail),
      h("h1", {}, "Run ", h("code", { text: t.example_id }), row && row.step !== null ? h("span", { class: "muted h1-sub", text: ` step ${row.step} · rollout ${row.rollout ?? "—"}` }) : null),
      h(
        "div",
        { class: "facts" },
        fact("reward", num(t.reward, 4)),
        ...Object.entries(t.policy_rewards || {}).map(([p, v]) => fact(h("span", {}, "reward of ", tag(p)), num(v, 4))),
        group && !several ? fact("advantage", num(group.advantage, 3)) : null,
        group && !several ? fact("group", group.shipped ? badge("shipped", "ok") : badge(group.why_not || "not shipped", "warn")) : null,
        ...(several
          ? t.groups.map((g) =>
              fact(h("span", {}, "group of ", tag(g.policy)), h("span", { class: "policy-group", dataset: { policy: g.policy } }, `advantage ${num(g.advantage, 3)} `, g.shipped ? badge("shipped", "ok") : badge(g.why_not || "not shipped", "warn"))),
            )
          : []),
        t.policies && t.policies.length ? fact("policies", h("span", { class: "run-policies" }, t.policies.map(tag))) : null,
        fact("step", step ?? "—"),
        fact("rollout", (row && row.rollout) ?? t.metadata.rollout ?? "—"),
        fact("split", t.metadata.split ?? "—"),
        t.metadata.policy_step !== undefined ? fact("policy step", t.metadata.policy_step) : null,
        fact("calls", num(t.calls)),
        fact("trainable turns", num(t.trainable_turns)),
        fact("took", seconds(duration)),
        fact("started", when(t.started_at)),
      ),
      exception,
      legend(words()),
      t.conversations.length ? t.conversations.map((c) => conversation(c, runPath, policies)) : h("p", { class: "muted", text: "this run recorded no LLM call that gave a turn" }),
      t.calls_without_turn.length
        ? h(
            "section",
            { class: "card" },
            h("h3", { text: "Calls that gave no turn" }),
            t.calls_without_turn.map((c) => h("p", { class: "why cause", text: `${c.model} (recorded by ${[c.source, c.framework].filter(Boolean).join(" / ")}): ${c.error || c.capture_error || (c.partial ? "the response did not arrive whole" : "no choice in the response")}` })),
          )
        : null,
      Object.keys(t.metadata).length || Object.keys(t.metrics).length
        ? h("details", { class: "card meta-box" }, h("summary", { text: "metadata and metrics" }), h("pre", { text: JSON.stringify({ metadata: t.metadata, metrics: t.metrics }, null, 2) }))
        : null,
    ];
  });
  const close = () => (document.getElementById("tip").hidden = true);
  return { ...page, close };
}
