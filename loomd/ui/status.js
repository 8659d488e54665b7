// loomd status page: polls the public JSON endpoints and follows /logz/stream.
// Every value from the server is inserted with textContent, never as HTML.
"use strict";

const POLL_MS = 1500;
const KEEP_REQUESTS = 50;
const KEEP_EVENTS = 200;
const seenRequests = new Map();   // id -> request object, with .gone once it left /v1/requests
const variantsOf = new Map();     // model@created -> text shown in the variants column

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

function num(value) { return el("td", value === undefined || value === null ? "—" : value, "num"); }

function bytes(n) {
  if (n === undefined || n === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function fill(tableId, rows, empty) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
  if (!rows.length) {
    const cols = document.querySelectorAll("#" + tableId + " thead th").length;
    const td = el("td", empty, "muted");
    td.colSpan = cols;
    body.appendChild(row([td]));
  }
}

async function getJson(path, headers) {
  const response = await fetch(path, { headers: headers || {}, cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  return body;
}

function residency(reg) {
  return (reg.components || []).map(c =>
    c.component + ": " + (c.resident ? "resident" : "evicted") + (c.pinned ? ", pinned" : "") +
    " on " + c.device + " (" + bytes(c.bytes) + ")").join("; ") || "—";
}

function cache(s) {
  if (!s) return "—";
  const parts = [];
  for (const [key, value] of Object.entries(s)) {
    if (/hit|quer/.test(key)) parts.push(key + " " + value);
  }
  if (s.prefixes !== undefined) parts.push("prefixes " + s.prefixes);
  if (s.retained !== undefined) parts.push("retained " + s.retained);
  if (s.checkpoints) parts.push("checkpoints " + s.checkpoints);
  return parts.join(", ") || "—";
}

async function variants(reg) {
  const key = reg.model + "@" + reg.created;
  if (!variantsOf.has(key)) {
    variantsOf.set(key, "…");
    getJson("/v1/models/variants", { "X-Loom-Model": reg.model })
      .then(body => {
        const list = body.data || [];
        variantsOf.set(key, list.length ? list.map(v => v.variant + " (" + (v.state || v.phase || "") + ")").join(", ") : "none");
      })
      .catch(() => variantsOf.set(key, "none"));
  }
  return variantsOf.get(key);
}

async function renderRegistrations(status) {
  const rows = [];
  for (const reg of status.registrations || []) {
    const s = reg.scheduler || {};
    const pages = s.pages_used === undefined ? "—" : s.pages_used + " / " + (s.pages_used + s.pages_free);
    rows.push(row([
      el("td", reg.model), el("td", reg.kind),
      el("td", reg.phase, "phase phase-" + reg.phase),
      el("td", reg.admission + (reg.removing ? " (removing)" : "")),
      el("td", residency(reg)), el("td", await variants(reg)),
      num(s.active === undefined ? undefined : s.active + " / " + s.rows), num(s.pending), num(pages),
      el("td", cache(reg.scheduler)),
      el("td", reg.error ? (reg.error.message || JSON.stringify(reg.error)) : "", "error"),
    ]));
  }
  fill("registrations", rows, "no registrations");
}

function renderMemory(status) {
  const rows = [];
  for (const device of status.devices || []) {
    for (const [owner, parts] of Object.entries(device.owners || {})) {
      const total = Object.values(parts).reduce((a, b) => a + b, 0);
      const other = total - (parts.params || 0) - (parts.state || 0);
      rows.push(row([el("td", device.device), el("td", owner), num(bytes(parts.params || 0)),
                     num(bytes(parts.state || 0)), num(bytes(other)), num(bytes(total))]));
    }
    const summary = row([el("td", device.device), el("td", "used of budget", "muted"), el("td"), el("td"), el("td"),
                         num(bytes(device.used_bytes) + " / " + bytes(device.budget_bytes))]);
    summary.className = "gone";
    rows.push(summary);
  }
  fill("memory", rows, "no devices");
}

function renderRequests(live) {
  const liveIds = new Set();
  for (const r of live.data || []) { liveIds.add(r.id); seenRequests.set(r.id, r); }
  for (const [id, r] of seenRequests) if (!liveIds.has(id)) r.gone = true;
  const ids = [...seenRequests.keys()].sort((a, b) => b - a);
  for (const id of ids.slice(KEEP_REQUESTS)) seenRequests.delete(id);
  const now = Date.now() / 1000;
  const rows = ids.slice(0, KEEP_REQUESTS).map(id => {
    const r = seenRequests.get(id);
    const state = r.gone ? "finished" : r.state;
    const tr = row([num(r.id), el("td", r.model), el("td", r.kind), el("td", state, "state-" + state),
                    num(r.prompt_tokens), num(r.completion_tokens), num(Math.max(0, now - r.created).toFixed(0) + " s")]);
    if (r.gone) tr.className = "gone";
    return tr;
  });
  fill("requests", rows, "no requests seen yet");
}

async function poll() {
  try {
    const [status, live] = await Promise.all([getJson("/v1/status"), getJson("/v1/requests?limit=1000")]);
    const server = status.server || {};
    document.getElementById("server").textContent =
      (server.stopping ? "stopping" : "serving") + " · up " + Math.round(server.uptime_s || 0) + " s";
    await renderRegistrations(status);
    renderMemory(status);
    renderRequests(live);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    document.getElementById("server").textContent = "unreachable: " + err.message;
  }
  setTimeout(poll, POLL_MS);
}

function addEvent(entry) {
  const list = document.getElementById("events");
  const { id, time, event, ...rest } = entry;
  const when = time ? new Date(time * 1000).toLocaleTimeString() : "";
  const detail = Object.entries(rest).map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v))).join(" ");
  const item = el("li", when + "  " + (event || "") + "  " + detail);
  item.dataset.id = id;
  list.prepend(item);
  if (event === "request" && entry.request !== undefined) {   // a finished request's record
    const known = seenRequests.get(entry.request) || {};
    seenRequests.set(entry.request, { ...known, id: entry.request, model: entry.model, kind: entry.kind,
      prompt_tokens: entry.prompt_tokens ?? entry.tokens ?? entry.input_tokens ?? entry.inputs, completion_tokens: entry.completion_tokens,
      created: known.created || time - (entry.duration_ms || 0) / 1000, gone: true });
  }
  while (list.children.length > KEEP_EVENTS) list.lastChild.remove();
}

function follow() {
  const stream = new EventSource("/logz/stream?cursor=0");
  const state = document.getElementById("stream");
  stream.onopen = () => { state.textContent = "live"; };
  stream.onerror = () => { state.textContent = "reconnecting…"; };
  stream.addEventListener("log", e => addEvent(JSON.parse(e.data)));
  stream.addEventListener("gap", e => {
    const gap = JSON.parse(e.data);
    addEvent({ id: gap.to, event: "gap", ...gap });
  });
}

poll();
follow();
