// What the pages of one folder share: the box shown instead of a page whose folder cannot be
// read (yet), and the trail back to the overview.

import { colorOf } from "./charts.js";
import { fill, h, problemBox } from "./dom.js";

/** The problem box for folder ``index`` when it is not ready, else null. */
export function gate(app, index) {
  const run = app.runs.find((r) => r.index === index);
  if (!run) return problemBox("No such run folder", `the viewer shows ${app.runs.length} folder(s); there is no folder ${index}`, "go back to the overview");
  if (run.state === "failed" && run.problem) {
    const box = problemBox(`${run.label} cannot be shown`, run.problem.message, run.problem.fix);
    box.append(h("p", { class: "muted small", text: run.path }));
    return box;
  }
  if (run.state !== "ready") {
    return h("section", { class: "card opening" }, h("h3", { text: `${run.label}: indexing…` }), h("p", { class: "muted", text: `${run.path}: the first time takes a while on a big run; this page shows it once it is done` }));
  }
  return null;
}

export function folder(app, index) {
  return app.runs.find((r) => r.index === index);
}

export function crumbs(app, index, ...trail) {
  const run = folder(app, index);
  return h(
    "nav",
    { class: "crumbs" },
    h("a", { href: "#/", text: "Overview" }),
    " › ",
    h("span", { class: "crumb-run" }, h("i", { class: "swatch", style: `background:${colorOf(index)}` }), run ? run.label : `folder ${index}`),
    trail.flatMap(([text, href]) => [" › ", href ? h("a", { href, text }) : h("span", { text })]),
  );
}

/** A page of one folder whose content is ``draw()``'s, re-drawn when the folder changes; while
 * the folder cannot be read, its problem box. */
export async function folderPage(box, app, index, draw) {
  const content = h("div");
  box.append(content);
  async function load() {
    const blocked = gate(app, index);
    if (blocked) {
      content.replaceChildren(blocked);
      return;
    }
    try {
      fill(content, await draw());
    } catch (error) {
      content.replaceChildren(problemBox(error.status === 404 ? "Not found" : "This page cannot be shown", error.message, error.fix));
    }
  }
  await load();
  return { runs: [index], refresh: load };
}

const ORIGINS = {
  "--tokenizer": "given with --tokenizer",
  "run folder": "saved in the run folder",
  "model, local folder": "the runs' model, a local folder",
  "model, HF cache": "the runs' model, in the Hugging Face cache",
};

function shortName(name) {
  const parts = name.split("/").filter(Boolean);
  return parts.length > 3 ? `…/${parts.slice(-3).join("/")}` : name;
}

/** What gives folder ``run``'s token ids their text, in words: ``short`` for the header,
 * ``long`` for a title or the run page, ``state``: ready, loading, failed or none. */
export function tokenizerWords(run) {
  const t = (run && run.tokenizer) || { state: "none" };
  const hint = "start arttrace view with --tokenizer NAME_OR_PATH (a folder a tokenizer was saved in, or a model in the Hugging Face cache) to see their text";
  const which = t.name ? `${t.name} (${ORIGINS[t.origin] || t.origin}${t.source !== t.name ? `: ${t.source}` : ""})` : "";
  if (t.state === "ready") {
    return { state: t.state, short: `text: ${shortName(t.name)}`, long: `each token's text is decoded by the tokenizer ${which}` };
  }
  if (t.state === "loading") {
    return { state: t.state, short: `loading tokenizer ${shortName(t.name)}…`, long: `loading the tokenizer ${which}; the tokens show their ids meanwhile` };
  }
  if (t.state === "failed") {
    return { state: t.state, short: "ids only: tokenizer failed", long: `token ids only: ${t.problem}; ${hint}` };
  }
  return { state: "none", short: "ids only: --tokenizer shows text", long: `token ids only: the runs hold each sampled token's id, and no tokenizer was found in the folder or the Hugging Face cache; ${hint}` };
}
