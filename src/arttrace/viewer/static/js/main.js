// The single-page app: a route per page (in the URL's #fragment), and the live loop that asks
// for the folders' versions and has the page fetch again when one it shows has changed.

import { get } from "./api.js";
import { colorOf } from "./charts.js";
import { clear, h, problemBox } from "./dom.js";
import { tokenizerWords } from "./common.js";
import { renderOverview } from "./overview.js";
import { renderStep, renderGroup } from "./step.js";
import { renderRun } from "./run.js";
import { renderFind } from "./find.js";

const POLL_MS = 750;
export const app = { runs: [], view: null, token: 0 };

function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  const parts = path.split("/").filter(Boolean);
  if (!parts.length) return { page: "overview", params };
  if (parts[0] === "find") return { page: "find", params };
  if (parts[0] === "r" && parts.length >= 4) {
    const run = Number(parts[1]);
    if (parts[2] === "step" && parts.length === 4) return { page: "step", run, step: Number(parts[3]), params };
    if (parts[2] === "step" && parts[4] === "group") {
      return { page: "group", run, step: Number(parts[3]), position: Number(parts[5]), params };
    }
    if (parts[2] === "run") return { page: "run", run, id: Number(parts[3]), params };
  }
  return { page: "missing", params };
}

const PAGES = {
  overview: renderOverview,
  find: renderFind,
  step: renderStep,
  group: renderGroup,
  run: renderRun,
};

async function show() {
  const started = app.token === 0 ? 0 : performance.now(); // the first: since navigation began
  const token = ++app.token;
  if (app.view && app.view.close) app.view.close();
  app.view = null;
  const r = route();
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === (r.page === "find" ? "find" : "overview"));
  }
  const main = document.getElementById("main");
  if (r.page === "missing") {
    main.replaceChildren(problemBox("No such page", `nothing is shown at ${location.hash}`, "go back to the overview"));
    document.body.dataset.ready = r.page;
    return;
  }
  const box = h("div", { class: "page", dataset: { page: r.page } });
  main.replaceChildren(box); // the page fills in as its answers arrive
  const view = await PAGES[r.page](box, r, app);
  if (token !== app.token) {
    if (view && view.close) view.close();
    return;
  }
  app.view = view || null;
  // Drawn: the frame that shows the page has been painted.
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  if (token !== app.token) return;
  document.body.dataset.ready = r.page;
  document.body.dataset.rendered = String(token);
  document.body.dataset.drawnMs = (performance.now() - started).toFixed(1);
}

function drawFolders() {
  const box = clear(document.getElementById("folders"));
  for (const run of app.runs) {
    const state =
      run.state === "failed" ? "cannot be read" : run.state === "opening" ? "indexing…" : run.kind || "";
    const tokens = run.state === "ready" ? tokenizerWords(run) : null;
    box.append(
      h(
        "span",
        { class: `folder ${run.state}`, title: run.path, dataset: { index: run.index } },
        h("i", { class: "swatch", style: `background:${colorOf(run.index)}` }),
        h("b", { text: run.label }),
        h("small", { text: state }),
        tokens ? h("small", { class: `tokenizer ${tokens.state}`, title: tokens.long, text: tokens.short }) : null,
      ),
    );
  }
}

let refreshing = false;
let again = false;

async function poll() {
  const live = document.getElementById("live");
  let listed;
  try {
    listed = await get("runs");
    live.textContent = "● live";
    live.className = "live on";
  } catch (error) {
    live.textContent = "● not connected";
    live.className = "live off";
    return;
  }
  const before = new Map(app.runs.map((r) => [r.index, `${r.version}|${r.state}`]));
  app.runs = listed.runs;
  const changed = app.runs.filter((r) => before.get(r.index) !== `${r.version}|${r.state}`).map((r) => r.index);
  if (!changed.length) return;
  drawFolders();
  const view = app.view;
  if (!view || !view.refresh) return;
  if (view.runs !== "all" && !changed.some((i) => (view.runs || []).includes(i))) return;
  if (refreshing) {
    again = true;
    return;
  }
  refreshing = true;
  try {
    do {
      again = false;
      await view.refresh(changed);
    } while (again && app.view === view);
  } finally {
    refreshing = false;
  }
}

async function start() {
  try {
    const given = document.getElementById("runs-now"); // the server's answer, in the page
    app.runs = given ? JSON.parse(given.textContent).runs : (await get("runs")).runs;
  } catch (error) {
    document.getElementById("main").replaceChildren(problemBox("The viewer does not answer", error.message, error.fix));
    return;
  }
  drawFolders();
  const live = document.getElementById("live");
  live.textContent = "● live";
  live.className = "live on";
  window.addEventListener("hashchange", show);
  await show();
  const loop = async () => {
    await poll();
    setTimeout(loop, POLL_MS);
  };
  setTimeout(loop, POLL_MS);
}

start();
