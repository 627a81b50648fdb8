// Building the page: elements from data, text always set as text (a run's prompts and answers
// are never parsed as HTML), and the number formats every page shares.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") el.style.cssText = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** ``el`` holding ``children`` only (nested lists flattened, null and false left out). */
export function fill(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

const FORMATS = new Map();

function format(places) {
  let found = FORMATS.get(places);
  if (!found) {
    found = new Intl.NumberFormat("en-US", { maximumFractionDigits: places });
    FORMATS.set(places, found);
  }
  return found;
}

/** A number for people: up to 4 decimals (trailing zeros dropped), thousands grouped. */
export function num(value, decimals = 4) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  if (Number.isInteger(value)) return Math.abs(value) < 1000 ? String(value) : format(0).format(value);
  const abs = Math.abs(value);
  const places = abs >= 1000 ? 0 : abs >= 100 ? 1 : decimals;
  return format(places).format(Number(value.toFixed(places)));
}

export function seconds(value) {
  if (value === null || value === undefined) return "—";
  if (value < 1) return `${(value * 1000).toFixed(0)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  return `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;
}

export function when(epoch) {
  if (!epoch) return "—";
  return new Date(epoch * 1000).toLocaleString("en-GB", { hour12: false });
}

/** The box a page shows instead of its content when the folder cannot be read. */
export function problemBox(title, error, fix) {
  return h(
    "section",
    { class: "problem", role: "alert" },
    h("h2", { text: title }),
    h("p", { class: "problem-message", text: error }),
    fix ? h("p", { class: "problem-fix" }, h("strong", { text: "What to do: " }), fix) : null,
  );
}

export function badge(text, kind = "", title = null) {
  return h("span", { class: `badge ${kind}`, text, title });
}

/** A policy's name in its colour (``color``: the run's colour for it, charts.policyColor). */
export function policyTag(name, color, title = "the policy this belongs to") {
  return h("span", { class: "policy-tag", text: name, title, style: `--c:${color}`, dataset: { policy: name } });
}

export function link(href, text, attrs = {}) {
  return h("a", { href, ...attrs }, text);
}

/** A table: ``columns`` are [header, cell(row) -> node|text, class?]; ``href(row)`` makes
 * each row a link. */
export function table(columns, rows, { href = null, empty = "nothing here", cls = "" } = {}) {
  if (!rows.length) return h("p", { class: "muted", text: empty });
  return h(
    "table",
    { class: `grid ${cls}` },
    h("thead", {}, h("tr", {}, columns.map(([name, , c]) => h("th", { class: c || null, text: name })))),
    h(
      "tbody",
      {},
      rows.map((row) => {
        const tr = h(
          "tr",
          { class: href ? "link" : null },
          columns.map(([, cell, c]) => h("td", { class: c || null }, cell(row))),
        );
        if (href) {
          const target = href(row);
          tr.dataset.href = target;
          tr.addEventListener("click", (event) => {
            if (event.target.closest("a")) return;
            location.hash = target;
          });
        }
        return tr;
      }),
    ),
  );
}

export function pager(offset, limit, total, go) {
  const last = Math.min(offset + limit, total);
  return h(
    "div",
    { class: "pager" },
    h("button", { disabled: offset <= 0, onclick: () => go(Math.max(0, offset - limit)), text: "← Previous" }),
    h("span", { class: "pager-range", text: total ? `${num(offset + 1)}–${num(last)} of ${num(total)}` : "0 of 0" }),
    h("button", { disabled: last >= total, onclick: () => go(offset + limit), text: "Next →" }),
  );
}
