// PicoMQ console: one page, five views (#/overview, #/streams, #/stream/NAME,
// #/consumers, #/cluster, #/access), built on the server's own endpoints. The token
// lives in this tab's sessionStorage and travels only in the Authorization header;
// nothing is logged. Elements are built with textContent only (never innerHTML), so
// stream data cannot become markup.
"use strict";

const TOKEN_KEY = "picomq.console.token";
const THEME_KEY = "picomq.console.theme";
const HISTORY_MS = 15 * 60 * 1000;
const TAIL_KEEP = 300;
// The live tail: records per poll, and the least time between polls.
const TAIL_PAGE = 200;
const TAIL_POLL_MS = 250;

// ---------- small helpers ----------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") el.textContent = v;
    else if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);
const fmtInt = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));

function fmtNum(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (a >= 100) return n.toFixed(0);
  if (a >= 1) return n.toFixed(1);
  if (a === 0) return "0";
  return n.toPrecision(2);
}

function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(1)) + " " + units[i];
}

const fmtMs = (s) => (s === null || s === undefined ? "–" : (s * 1000 < 10 ? (s * 1000).toFixed(2) : (s * 1000).toFixed(1)) + " ms");
const fmtDollars = (d) => (d === null || d === undefined ? "–" : "$" + (d >= 100 ? d.toFixed(0) : d >= 1 ? d.toFixed(2) : d.toFixed(4)));
const fmtTime = (ms) => (ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC"));

function fmtSecs(s) {
  if (s === null || s === undefined || s === "") return "none";
  s = Number(s);
  if (s % 86400 === 0) return s / 86400 + " d";
  if (s % 3600 === 0) return s / 3600 + " h";
  if (s % 60 === 0) return s / 60 + " min";
  return s + " s";
}

// The byte position of a Durable Streams offset ("GGGG_PPPP").
function offsetPos(o) {
  if (!o || typeof o !== "string" || !o.includes("_")) return null;
  return Number(o.split("_")[1]);
}

// A stream's name is its URL path as it was sent, percent-escapes kept: it goes
// back into a URL as it is, and only what a URL cannot carry as it is gets escaped
// (a "%" that starts no escape, spaces, non-ASCII). A dot segment (".", "..",
// "%2e" and the like) would be resolved away by the browser, so the request would
// address another path: no stream has one, and such a name is never sent.
function isStreamName(name) {
  return typeof name === "string" && name !== "" &&
    !name.split("/").some((s) => s === "" || /^(\.|%2e){1,2}$/i.test(s));
}

function streamPath(name) {
  if (!isStreamName(name)) {
    throw new ApiError(400, "bad_name", `${JSON.stringify(name)} is not a stream name (it has an empty, . or .. segment).`);
  }
  const escape = (seg) => seg.replace(/%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@%]/g, (c) => encodeURIComponent(c));
  return "/" + name.split("/").map(escape).join("/");
}
const nativePath = (name, action) => "/__picomq/streams" + streamPath(name) + "/" + action;
const streamHref = (name) => "#/stream/" + encodeURIComponent(name);

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// What a failed answer means, in words a person can act on.
async function errorOf(r, path) {
  let code = "";
  let message = "";
  const text = await r.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    code = (body.error && body.error.code) || "";
    message = (body.error && body.error.message) || "";
  } catch (_) {
    message = text.trim().slice(0, 300);
  }
  let words;
  if (r.status === 401) {
    words = "This needs a token: sign in on the Access page" + (message ? ` (${message})` : "") + ".";
  } else if (r.status === 403) {
    words = "Refused: this token may not do this" + (message ? ` (${message})` : "") + ".";
  } else if (r.status === 404 && !code && !message) {
    words = `This port does not serve ${path.split("?")[0]}. The admin port serves only the overview (metrics and health); open the console on the API port for the other pages.`;
  } else if (r.status === 429) {
    words = "Too many requests: the server's rate limit was reached; the console will try again" + (message ? ` (${message})` : "") + ".";
  } else {
    words = `${r.status} ${r.statusText || ""}`.trim() + (message ? `: ${message}` : "");
  }
  return new ApiError(r.status, code, words);
}

async function api(method, path, opts = {}) {
  const headers = new Headers(opts.headers || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.set("authorization", "Bearer " + token);
  let body = opts.body;
  if (opts.json !== undefined) {
    headers.set("content-type", "application/json");
    body = JSON.stringify(opts.json);
  }
  let r;
  try {
    r = await fetch(path, { method, headers, body, signal: opts.signal, cache: "no-store", credentials: "omit" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "unreachable", "The server did not answer (is it running, and is this the right address?).");
  }
  if (!r.ok && !(opts.accept || []).includes(r.status)) throw await errorOf(r, path);
  return r;
}

const getJson = async (path, opts) => (await api("GET", path, opts)).json();

// ---------- shared page pieces ----------

function showBanner(text) {
  const b = $("banner");
  b.textContent = text || "";
  b.hidden = !text;
}

function msg(id) {
  return h("p", { id, class: "msg", role: "status", "aria-live": "polite" });
}

function say(el, text, ok) {
  if (!el) return;
  el.textContent = text || "";
  el.className = "msg " + (ok ? "okmsg" : text ? "error" : "");
}

function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "label", text: label }), h("div", { class: "value", id, text: value }));
}

// A table around `body` (a tbody the caller fills); a "#" before a heading marks a
// numeric column.
function table(id, heads, body) {
  return h("div", { class: "table-wrap" },
    h("table", { id },
      h("thead", {}, h("tr", {}, heads.map((c) => h("th", { scope: "col", class: c.startsWith("#") ? "num" : "", text: c.replace(/^#/, "") })))),
      body));
}

function confirmDialog({ title, text, confirm, typeToConfirm }) {
  const dlg = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = confirm;
  const label = $("confirm-label");
  const input = $("confirm-input");
  label.hidden = !typeToConfirm;
  input.value = "";
  $("confirm-hint").textContent = typeToConfirm ? `Type ${typeToConfirm} to confirm` : "";
  return new Promise((resolve) => {
    const form = $("confirm-form");
    const done = (ok) => {
      form.removeEventListener("submit", onSubmit);
      $("confirm-cancel").removeEventListener("click", onCancel);
      dlg.removeEventListener("cancel", onCancel);
      if (dlg.open) dlg.close();
      resolve(ok);
    };
    const onSubmit = (e) => {
      e.preventDefault();
      if (typeToConfirm && input.value !== typeToConfirm) {
        $("confirm-hint").textContent = `Type ${typeToConfirm} exactly to confirm`;
        return;
      }
      done(true);
    };
    const onCancel = (e) => { e.preventDefault(); done(false); };
    form.addEventListener("submit", onSubmit);
    $("confirm-cancel").addEventListener("click", onCancel);
    dlg.addEventListener("cancel", onCancel);
    dlg.showModal();
    (typeToConfirm ? input : $("confirm-cancel")).focus();
  });
}

// A repeating task that stops with its page and rests while the tab is hidden.
function every(ms, fn, page) {
  let timer = null;
  let stopped = false;
  const run = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try { await fn(); } catch (_) { /* each task shows its own errors */ }
    }
    if (!stopped) timer = setTimeout(run, typeof ms === "function" ? ms() : ms);
  };
  run();
  page.cleanups.push(() => { stopped = true; clearTimeout(timer); });
}

// ---------- metrics: samples and rates ----------

const WANTED = [
  "picomq_appends_total", "picomq_append_records_total", "picomq_append_bytes_total",
  "picomq_live_readers", "picomq_active_streams", "picomq_streams",
  "picomq_object_store_requests_total", "picomq_object_store_cost_dollars_total",
  "picomq_wal_commit_seconds_bucket", "picomq_append_duration_seconds_bucket", "picomq_wal_state",
  "picomq_cluster_takeovers_total", "picomq_cluster_slots_owned", "picomq_cluster_members_alive",
];

// Prometheus text into {family: [[labels, value]]}, keeping only the families used.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line.startsWith("picomq_")) continue;
    const brace = line.indexOf("{");
    const space = line.lastIndexOf(" ");
    const name = line.slice(0, brace >= 0 && brace < space ? brace : line.indexOf(" "));
    if (!WANTED.includes(name)) continue;
    const labels = {};
    if (brace >= 0 && brace < space) {
      const inner = line.slice(brace + 1, line.lastIndexOf("}"));
      for (const m of inner.matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[m[1]] = m[2];
    }
    const value = Number(line.slice(space + 1));
    (out[name] = out[name] || []).push([labels, value]);
  }
  return out;
}

function sum(fam, where) {
  if (!fam) return null;
  let total = 0;
  for (const [labels, v] of fam) {
    if (!where || Object.entries(where).every(([k, want]) => labels[k] === want)) total += v;
  }
  return total;
}

function buckets(fam) {
  if (!fam) return null;
  const by = new Map();
  for (const [labels, v] of fam) {
    const le = labels.le === "+Inf" ? Infinity : Number(labels.le);
    by.set(le, (by.get(le) || 0) + v);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

function sampleOf(text, t) {
  const m = parseMetrics(text);
  const state = (m.picomq_wal_state || []).find(([, v]) => v === 1);
  return {
    t,
    appends: sum(m.picomq_appends_total),
    records: sum(m.picomq_append_records_total),
    bytes: sum(m.picomq_append_bytes_total),
    live: sum(m.picomq_live_readers),
    active: sum(m.picomq_active_streams),
    streams: sum(m.picomq_streams),
    puts: sum(m.picomq_object_store_requests_total, { op: "put" }),
    gets: sum(m.picomq_object_store_requests_total, { op: "get" }),
    cost: sum(m.picomq_object_store_cost_dollars_total),
    commit: buckets(m.picomq_wal_commit_seconds_bucket),
    append: buckets(m.picomq_append_duration_seconds_bucket),
    walState: state ? state[0].state : null,
    takeovers: sum(m.picomq_cluster_takeovers_total),
  };
}

// The q-quantile of what was observed between two cumulative histograms.
function quantile(q, older, newer) {
  if (!older || !newer || older.length !== newer.length) return null;
  const d = newer.map(([le, c], i) => [le, c - older[i][1]]);
  const total = d[d.length - 1][1];
  if (!(total > 0)) return null;
  const want = q * total;
  let prevLe = 0;
  let prevC = 0;
  for (const [le, c] of d) {
    if (c >= want) {
      if (le === Infinity) return prevLe;
      return prevLe + ((le - prevLe) * (want - prevC)) / Math.max(c - prevC, 1e-9);
    }
    prevLe = le;
    prevC = c;
  }
  return prevLe;
}

// Polls /metrics and /readyz while the overview is shown; keeps 15 minutes.
const sampler = {
  samples: [],
  ready: null,
  error: "",
  refreshMs: Number(sessionStorage.getItem("picomq.console.refresh") || 1000),
  listeners: new Set(),
  async tick() {
    const t = Date.now();
    const [metrics, ready] = await Promise.allSettled([
      api("GET", "/metrics").then((r) => r.text()),
      api("GET", "/readyz", { accept: [503] }).then(async (r) => ({ ok: r.ok, text: (await r.text()).trim() })),
    ]);
    this.ready = ready.status === "fulfilled" ? ready.value : { ok: false, text: ready.reason.message };
    if (metrics.status === "fulfilled") {
      this.error = "";
      this.refused = false;
      this.samples.push(sampleOf(metrics.value, t));
      while (this.samples.length && this.samples[0].t < t - HISTORY_MS - 5000) this.samples.shift();
    } else {
      this.error = metrics.reason.message;
      this.refused = [401, 403].includes(metrics.reason.status);
    }
    for (const f of this.listeners) f();
  },
  nextDelay() {
    return this.refused ? Math.max(this.refreshMs, 10000) : this.refreshMs;
  },
};

// Per-second rates of a counter, one point per sample (null across restarts).
function rates(samples, key, scale = 1) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    const dt = (b.t - a.t) / 1000;
    const v = a[key] === null || b[key] === null || b[key] < a[key] || dt <= 0 ? null : ((b[key] - a[key]) / dt) * scale;
    out.push([b.t, v]);
  }
  return out;
}

function gauges(samples, key) {
  return samples.map((s) => [s.t, s[key]]);
}

// Latency quantiles over a sliding window of five samples.
function quantiles(samples, key, q) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const j = Math.max(0, i - 5);
    out.push([samples[i].t, quantile(q, samples[j][key], samples[i][key])]);
  }
  return out;
}

function drawChart(canvas, series, fmt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const hgt = canvas.clientHeight;
  if (!w || !hgt) return;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(hgt * dpr);
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  const css = getComputedStyle(document.documentElement);
  const colors = [css.getPropertyValue("--accent").trim(), css.getPropertyValue("--accent2").trim()];
  const line = css.getPropertyValue("--line").trim();
  const muted = css.getPropertyValue("--muted").trim();
  // The last 15 minutes, or since the first sample when there is less history.
  const now = Date.now();
  let first = now;
  for (const s of series) if (s.length) first = Math.min(first, s[0][0]);
  const x0 = Math.max(now - HISTORY_MS, Math.min(first, now - 60000));
  const span = now - x0;
  let max = 0;
  for (const s of series) for (const [, v] of s) if (v !== null && v > max) max = v;
  max = max > 0 ? max * 1.15 : 1;
  const left = 4;
  const top = 14;
  const ph = hgt - top - 14;
  const pw = w - left - 4;
  ctx.strokeStyle = line;
  ctx.lineWidth = 1;
  for (let g = 0; g <= 2; g++) {
    const y = top + (ph * g) / 2 + 0.5;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + pw, y); ctx.stroke();
  }
  ctx.fillStyle = muted;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(fmt(max), left + 2, 11);
  ctx.fillText(span >= HISTORY_MS ? "15 min ago" : Math.round(span / 1000) + " s ago", left + 2, hgt - 2);
  ctx.textAlign = "right";
  ctx.fillText("now", left + pw, hgt - 2);
  series.forEach((s, k) => {
    ctx.strokeStyle = colors[k % colors.length];
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    let pen = false;
    for (const [t, v] of s) {
      if (t < x0 || v === null) { pen = false; continue; }
      const x = left + ((t - x0) / span) * pw;
      const y = top + ph - (v / max) * ph;
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    }
    ctx.stroke();
  });
}

const CHARTS = [
  { id: "appends", title: "Appends/s", fmt: fmtNum, series: (s) => [rates(s, "appends")] },
  { id: "records", title: "Records/s", fmt: fmtNum, series: (s) => [rates(s, "records")] },
  { id: "bytes", title: "Bytes/s", fmt: (v) => fmtBytes(v) + "/s", series: (s) => [rates(s, "bytes")] },
  { id: "live", title: "Live readers", fmt: fmtNum, series: (s) => [gauges(s, "live")] },
  { id: "streams", title: "Streams", names: ["active", "total"], fmt: fmtNum, series: (s) => [gauges(s, "active"), gauges(s, "streams")] },
  { id: "store", title: "Object store requests/s", names: ["PUT", "GET"], fmt: fmtNum, series: (s) => [rates(s, "puts"), rates(s, "gets")] },
  { id: "cost", title: "Estimated cost per day", fmt: fmtDollars, series: (s) => [rates(s, "cost", 86400)] },
  { id: "commit", title: "WAL commit latency", names: ["p50", "p99"], fmt: fmtMs, series: (s) => [quantiles(s, "commit", 0.5), quantiles(s, "commit", 0.99)] },
  { id: "append", title: "Append latency", names: ["p50", "p99"], fmt: fmtMs, series: (s) => [quantiles(s, "append", 0.5), quantiles(s, "append", 0.99)] },
];

function lastValue(s) {
  for (let i = s.length - 1; i >= 0; i--) if (s[i][1] !== null) return s[i][1];
  return null;
}

// ---------- pages ----------

const pages = {};

pages.overview = (view, page) => {
  const refresh = h("select", { id: "refresh", "aria-label": "Refresh every" },
    [[1000, "every 1 s"], [5000, "every 5 s"], [15000, "every 15 s"], [0, "paused"]].map(([v, t]) =>
      h("option", { value: v, selected: sampler.refreshMs === v, text: t })));
  refresh.addEventListener("change", () => {
    sampler.refreshMs = Number(refresh.value);
    sessionStorage.setItem("picomq.console.refresh", refresh.value);
  });
  const status = msg("overview-msg");
  const cards = h("div", { class: "cards" },
    card("Health", "–", "ov-health"), card("Readiness", "–", "ov-ready"), card("WAL", "–", "ov-wal"),
    card("Streams", "–", "ov-streams"), card("Active streams", "–", "ov-active"),
    card("Live readers", "–", "ov-live"), card("Cost per day", "–", "ov-cost"));
  const charts = CHARTS.map((c) => {
    const canvas = h("canvas", { role: "img", "aria-label": c.title + " over the last 15 minutes" });
    const now = h("span", { class: "now", id: "chart-" + c.id + "-now", text: "–" });
    const legend = c.names ? h("div", { class: "legend" }, c.names.map((n, i) => h("span", {}, h("i", { class: "s" + i }), n))) : null;
    const el = h("section", { class: "chart", id: "chart-" + c.id, "aria-label": c.title },
      h("div", { class: "head" }, h("h3", { text: c.title }), now), legend, canvas);
    return { c, el, canvas, now };
  });
  view.append(
    h("div", { class: "row" }, h("h1", { class: "grow", text: "Overview" }), h("label", {}, "Refresh", refresh)),
    status, cards, h("div", { class: "grid" }, charts.map((x) => x.el)),
    h("p", { class: "muted", text: "Rates are computed in this page from /metrics samples; the cost is the node's estimate from its --price-* flags, extrapolated to a day." }));

  const health = async () => {
    try {
      await api("GET", "/healthz");
      $("ov-health").textContent = "alive";
    } catch (e) {
      $("ov-health").textContent = e.status === 0 ? "unreachable" : "error";
    }
  };
  const render = () => {
    const s = sampler.samples;
    say(status, sampler.error);
    const ready = sampler.ready;
    if (ready) {
      $("ov-ready").textContent = ready.ok ? "ready" : ready.text.replace(/^not ready: /, "not ready: ");
    }
    const last = s[s.length - 1];
    if (last) {
      $("ov-wal").textContent = last.walState || "–";
      $("ov-streams").textContent = fmtInt(last.streams);
      $("ov-active").textContent = fmtInt(last.active);
      $("ov-live").textContent = fmtInt(last.live);
    }
    for (const x of charts) {
      const series = x.c.series(s);
      const values = series.map(lastValue);
      x.now.textContent = values.map((v) => x.c.fmt(v)).join(" / ");
      if (x.c.id === "cost") $("ov-cost").textContent = x.c.fmt(values[0]);
      drawChart(x.canvas, series, x.c.fmt);
    }
  };
  sampler.listeners.add(render);
  page.cleanups.push(() => sampler.listeners.delete(render));
  window.addEventListener("resize", render);
  page.cleanups.push(() => window.removeEventListener("resize", render));
  health();
  render();
  every(() => (sampler.refreshMs ? sampler.nextDelay() : 1000), async () => {
    if (sampler.refreshMs) await sampler.tick();
  }, page);
};

pages.streams = (view, page) => {
  const q = page.query;
  const prefix = h("input", { id: "streams-prefix", value: q.get("prefix") || "", placeholder: "orders/", autocomplete: "off", spellcheck: "false" });
  const filter = h("input", { id: "streams-filter", value: "", placeholder: "part of a name", autocomplete: "off" });
  const limit = h("select", { id: "streams-limit" }, [25, 50, 100, 500].map((n) => h("option", { value: n, selected: n === 50, text: n })));
  const status = msg("streams-msg");
  const body = h("tbody");
  const prev = h("button", { type: "button", class: "ghost", id: "streams-prev", text: "Previous page", disabled: true });
  const next = h("button", { type: "button", class: "ghost", id: "streams-next", text: "Next page", disabled: true });
  const pageInfo = h("span", { class: "muted" });
  let afters = [""];
  let nextAfter = null;
  let rows = [];

  const show = () => {
    const f = filter.value.trim().toLowerCase();
    const shown = rows.filter((s) => !f || s.name.toLowerCase().includes(f));
    body.replaceChildren(...shown.map((s) => h("tr", {},
      h("td", {}, h("a", { href: streamHref(s.name), text: s.name })),
      h("td", { class: "mono", text: s.contentType }),
      h("td", { class: "mono hide-narrow", text: s.nextOffset }),
      h("td", {}, s.closed ? h("span", { class: "badge warn", text: "closed" }) : h("span", { class: "badge ok", text: "open" })),
      h("td", { class: "hide-narrow", text: s.expiresAt ? "expires " + s.expiresAt : s.ttlSeconds ? "TTL " + fmtSecs(s.ttlSeconds) : "–" }),
      h("td", { class: "hide-narrow", text: s.retentionSeconds ? fmtSecs(s.retentionSeconds) : "–" }),
      h("td", { class: "hide-narrow", text: s.createdAt || "–" }))));
    if (!shown.length) {
      body.append(h("tr", {}, h("td", { colspan: 7, class: "muted", text: rows.length ? "No stream on this page matches the filter." : "No streams under this prefix." })));
    }
    pageInfo.textContent = `page ${afters.length}, ${shown.length} of ${rows.length} shown`;
    prev.disabled = afters.length <= 1;
    next.disabled = !nextAfter;
  };
  const load = async () => {
    const params = new URLSearchParams({ prefix: prefix.value, limit: limit.value });
    const after = afters[afters.length - 1];
    if (after) params.set("after", after);
    try {
      const r = await getJson("/__picomq/streams?" + params);
      rows = r.streams;
      nextAfter = r.next;
      say(status, "");
    } catch (e) {
      rows = [];
      nextAfter = null;
      say(status, e.message);
    }
    show();
  };
  const restart = () => { afters = [""]; load(); };
  prefix.addEventListener("input", () => { clearTimeout(prefix._t); prefix._t = setTimeout(restart, 250); });
  limit.addEventListener("change", restart);
  filter.addEventListener("input", show);
  next.addEventListener("click", () => { afters.push(nextAfter); load(); });
  prev.addEventListener("click", () => { afters.pop(); load(); });

  // Creating a stream: PUT with its content type.
  const newName = h("input", { id: "create-name", placeholder: "orders/2026", autocomplete: "off", spellcheck: "false", required: true });
  const newType = h("select", { id: "create-type" }, ["application/json", "text/plain", "application/octet-stream"].map((t) => h("option", { value: t, text: t })));
  const createMsg = msg("create-msg");
  const create = h("form", { class: "row", id: "create-form" },
    h("label", { class: "grow" }, "Name", newName), h("label", {}, "Content type", newType),
    h("button", { type: "submit", text: "Create stream" }));
  create.addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = newName.value.trim().replace(/^\/+/, "");
    if (!name) return say(createMsg, "Give the stream a name.");
    try {
      const r = await api("PUT", streamPath(name), { headers: { "content-type": newType.value } });
      say(createMsg, r.status === 201 ? `Created ${name}.` : `${name} already exists with this configuration.`, true);
      load();
    } catch (err) {
      say(createMsg, err.message);
    }
  });

  view.append(
    h("h1", { text: "Streams" }),
    h("section", { class: "panel" },
      h("div", { class: "row" },
        h("label", { class: "grow" }, "Prefix (server-side)", prefix),
        h("label", { class: "grow" }, "Filter this page", filter),
        h("label", {}, "Per page", limit),
        h("button", { type: "button", class: "ghost", id: "streams-refresh", text: "Refresh", onclick: load })),
      status,
      table("streams-table", ["Name", "Type", "Next offset", "State", "TTL / expiry", "Retention", "Created"], body),
      h("div", { class: "row" }, prev, next, pageInfo)),
    h("section", { class: "panel" }, h("h2", { text: "New stream" }), create, createMsg));
  every(5000, load, page);
};

function decodeBase64(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

function hexDump(bytes) {
  const lines = [];
  const n = Math.min(bytes.length, 4096);
  for (let i = 0; i < n; i += 16) {
    const row = bytes.slice(i, Math.min(i + 16, n));
    const hex = [...row].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = [...row].map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(i.toString(16).padStart(6, "0") + "  " + hex.padEnd(48) + " " + ascii);
  }
  if (bytes.length > n) lines.push(`… ${bytes.length - n} more bytes`);
  return lines.join("\n");
}

// A record's body as a person reads it: JSON pretty-printed, text as text, bytes as hex.
function bodyView(rec, json) {
  if (rec.body_base64 !== undefined) return { kind: "binary", text: hexDump(decodeBase64(rec.body_base64)) };
  const text = rec.body;
  if (json || /^\s*[[{]/.test(text)) {
    try { return { kind: "json", text: JSON.stringify(JSON.parse(text), null, 2) }; } catch (_) { /* shown as text */ }
  }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/.test(text)) return { kind: "binary", text: hexDump(new TextEncoder().encode(text)) };
  return { kind: "text", text };
}

function recordItem(rec, json) {
  const b = bodyView(rec, json);
  return h("li", { "data-seq": rec.seq },
    h("div", { class: "rh" },
      h("strong", { text: "#" + rec.seq }), h("span", { text: fmtTime(rec.timestamp) }),
      h("span", { class: "mono hide-narrow", text: rec.offset }), h("span", { text: b.kind }),
      (rec.headers || []).map(([k, v]) => h("span", { class: "mono", text: `${k}: ${v}` }))),
    h("pre", { text: b.text }));
}

pages.stream = (view, page) => {
  const name = page.arg;
  if (!isStreamName(name)) {
    view.append(h("p", {}, h("a", { href: "#/streams", text: "← Streams" })),
      h("p", { class: "msg error", id: "stream-msg", role: "status", text: `${JSON.stringify(name)} is not a stream name (it has an empty, . or .. segment); nothing here can act on it.` }));
    return;
  }
  const isJson = () => (page.meta.type || "").startsWith("application/json");
  page.meta = {};
  const meta = h("dl", { class: "meta", id: "stream-meta" });
  const metaMsg = msg("stream-msg");
  const title = h("h1", { id: "stream-title", text: name });

  const loadMeta = async () => {
    const [head, info] = await Promise.allSettled([
      api("HEAD", streamPath(name)),
      getJson(nativePath(name, "info")),
    ]);
    if (head.status === "rejected") {
      const e = head.reason;
      say(metaMsg, e.status === 404 ? "No such stream (it may have been deleted), or this token may not read it." : e.status === 410 ? "This stream was deleted (its data is kept for its forks)." : e.message);
      return false;
    }
    const hd = head.value.headers;
    const i = info.status === "fulfilled" ? info.value : {};
    page.meta = { type: hd.get("content-type") || "", closed: hd.get("stream-closed") === "true", info: i };
    const rows = [
      ["Content type", hd.get("content-type")],
      ["State", page.meta.closed ? "closed" : "open"],
      ["Records", i.records !== undefined ? fmtInt(i.records) + ` (seq ${i.first_seq} to ${i.next_seq - 1})` : "–"],
      ["Start offset", hd.get("stream-start-offset")],
      ["Next offset", hd.get("stream-next-offset")],
      ["First record", i.first_timestamp ? fmtTime(i.first_timestamp) : "–"],
      ["Last record", i.last_timestamp ? fmtTime(i.last_timestamp) : "–"],
      ["TTL", hd.get("stream-ttl") ? fmtSecs(hd.get("stream-ttl")) : "none"],
      ["Expires at", hd.get("stream-expires-at") || "never"],
      ["Retention", hd.get("stream-retention") ? fmtSecs(hd.get("stream-retention")) : "keep everything"],
    ];
    if (i.forked_from) rows.push(["Forked from", `${i.forked_from.stream} at ${i.forked_from.offset} (record #${i.forked_from.seq} is its own first)`]);
    meta.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { class: "mono", text: v || "–" })]));
    say(metaMsg, info.status === "rejected" ? "Record numbers unavailable: " + info.reason.message : "");
    closeBtn.disabled = page.meta.closed;
    title.replaceChildren(name, " ", page.meta.closed ? h("span", { class: "badge warn", text: "closed" }) : h("span", { class: "badge ok", text: "open" }));
    if (!modeTouched) mode.value = isJson() ? "json" : "text";
    return true;
  };

  // Reading records from anywhere.
  const fromKind = h("select", { id: "read-kind", "aria-label": "Read from" },
    [["tail", "the last N records"], ["seq", "sequence number"], ["offset", "offset"], ["timestamp", "time (ms or RFC 3339)"]].map(([v, t]) => h("option", { value: v, text: t })));
  const fromValue = h("input", { id: "read-from", value: "20", autocomplete: "off", spellcheck: "false" });
  const count = h("input", { id: "read-count", type: "number", min: 1, max: 1000, value: 50 });
  const list = h("ul", { class: "records", id: "read-list" });
  const readMsg = msg("read-msg");
  let readNext = null;
  const more = h("button", { type: "button", class: "ghost", id: "read-more", text: "Next records", disabled: true });
  const read = async (params) => {
    try {
      const r = await getJson(nativePath(name, "records") + "?" + params);
      list.replaceChildren(...r.records.map((rec) => recordItem(rec, isJson())));
      readNext = r.records.length ? r.next_seq : null;
      more.disabled = readNext === null || r.up_to_date;
      say(readMsg, r.records.length ? `${r.records.length} record${r.records.length === 1 ? "" : "s"}, up to seq ${r.next_seq - 1}${r.up_to_date ? " (the tail)" : ""}.` : "No records there.", true);
    } catch (e) {
      say(readMsg, e.message);
    }
  };
  const readForm = h("form", { class: "row", id: "read-form" },
    h("label", {}, "From", fromKind), h("label", { class: "grow" }, "Value", fromValue),
    h("label", {}, "Count", count), h("button", { type: "submit", text: "Read" }), more);
  fromKind.addEventListener("change", () => {
    fromValue.value = { tail: "20", seq: String((page.meta.info && page.meta.info.first_seq) || 0), offset: "-1", timestamp: new Date(Date.now() - 3600e3).toISOString() }[fromKind.value];
  });
  readForm.addEventListener("submit", (e) => {
    e.preventDefault();
    read(new URLSearchParams({ [fromKind.value]: fromValue.value.trim(), count: count.value }));
  });
  more.addEventListener("click", () => read(new URLSearchParams({ seq: readNext, count: count.value })));

  // The live tail: long-polls from the tail, each answer as soon as records are durable.
  const tail = h("ul", { class: "records", id: "tail-list", "aria-live": "polite" });
  const tailMsg = msg("tail-msg");
  const follow = h("button", { type: "button", id: "tail-toggle", class: "ghost", text: "Pause" });
  let following = true;
  let controller = null;
  const runTail = async () => {
    let from = "offset=now";
    say(tailMsg, "Following: new records appear here as soon as they are durable.", true);
    let skipped = 0;
    let metaAt = 0;
    while (following && !page.gone) {
      controller = new AbortController();
      const asked = performance.now();
      try {
        const r = await getJson(nativePath(name, "records") + "?" + from + "&live=long-poll&count=" + TAIL_PAGE, { signal: controller.signal });
        for (const rec of r.records) tail.prepend(recordItem(rec, isJson()));
        while (tail.children.length > TAIL_KEEP) tail.lastChild.remove();
        // Faster than a person can read: jump to the tail rather than fall behind.
        const behind = r.records.length >= TAIL_PAGE && !r.up_to_date;
        from = behind ? "offset=now" : "seq=" + r.next_seq;
        if (behind) skipped++;
        say(tailMsg, `Following: new records appear here as soon as they are durable (next seq ${r.next_seq})` +
          (skipped ? `; the stream runs faster than this page shows, so it jumped to the newest records ${skipped} times.` : "."), true);
        // At most one poll per TAIL_POLL_MS: a busy stream costs the server a few
        // requests a second, not one per append.
        if (r.records.length) await new Promise((res) => setTimeout(res, Math.max(0, TAIL_POLL_MS - (performance.now() - asked))));
        // The metadata (record count, offsets) follows at most every 2 s.
        if (r.records.length && performance.now() - metaAt > 2000) { metaAt = performance.now(); loadMeta(); }
        if (r.closed) { say(tailMsg, "The stream is closed: nothing more will arrive.", true); following = false; }
      } catch (e) {
        if (e.name === "AbortError") break;
        say(tailMsg, "The live tail stopped: " + e.message);
        if ([401, 403, 404, 410].includes(e.status)) { following = false; break; }
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
    follow.textContent = following ? "Pause" : "Follow";
  };
  follow.addEventListener("click", () => {
    following = !following;
    follow.textContent = following ? "Pause" : "Follow";
    if (following) runTail(); else { if (controller) controller.abort(); say(tailMsg, "Paused."); }
  });
  page.cleanups.push(() => { page.gone = true; if (controller) controller.abort(); });

  // Actions.
  const text = h("textarea", { id: "append-body", placeholder: '{"hello": "world"} or any text', "aria-label": "Record body" });
  const mode = h("select", { id: "append-mode", "aria-label": "Body is" }, h("option", { value: "json", text: "JSON" }), h("option", { value: "text", text: "text" }));
  let modeTouched = false;
  mode.addEventListener("change", () => { modeTouched = true; });
  const appendMsg = msg("append-msg");
  const appendForm = h("form", { id: "append-form" }, text,
    h("div", { class: "row" }, h("label", {}, "Body is", mode), h("button", { type: "submit", id: "append-submit", text: "Append" })), appendMsg);
  appendForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    let record;
    if (mode.value === "json") {
      try { record = { json: JSON.parse(text.value) }; } catch (err) { return say(appendMsg, "That is not valid JSON: " + err.message); }
    } else {
      record = { body: text.value };
    }
    try {
      const r = await (await api("POST", nativePath(name, "records"), { json: { records: [record] } })).json();
      say(appendMsg, `Appended as record #${r.first_seq} (next offset ${r.next_offset}).`, true);
      text.value = "";
      loadMeta();
    } catch (err) {
      say(appendMsg, err.message);
    }
  });

  const actMsg = msg("action-msg");
  const closeBtn = h("button", { type: "button", id: "close-stream", class: "ghost", text: "Close stream" });
  closeBtn.addEventListener("click", async () => {
    if (!(await confirmDialog({ title: "Close " + name + "?", text: "Readers see the end of the stream and no more appends are accepted. This cannot be undone.", confirm: "Close" }))) return;
    try {
      await api("POST", streamPath(name), { headers: { "stream-closed": "true" } });
      say(actMsg, "Closed.", true);
      loadMeta();
    } catch (e) { say(actMsg, e.message); }
  });
  const trimSeq = h("input", { id: "trim-seq", type: "number", min: 0, placeholder: "seq", "aria-label": "Trim records before sequence number" });
  const trimBtn = h("button", { type: "button", id: "trim-stream", class: "ghost", text: "Trim before" });
  trimBtn.addEventListener("click", async () => {
    const n = trimSeq.value.trim();
    if (!/^\d+$/.test(n)) return say(actMsg, "Give the sequence number of the first record to keep.");
    if (!(await confirmDialog({ title: "Trim " + name + "?", text: `Records before #${n} are dropped for good; reads there answer 410.`, confirm: "Trim" }))) return;
    try {
      const r = await (await api("POST", nativePath(name, "trim") + "?before_seq=" + n)).json();
      say(actMsg, `Trimmed: the stream now starts at record #${r.first_seq}.`, true);
      loadMeta();
    } catch (e) { say(actMsg, e.message); }
  });
  const delBtn = h("button", { type: "button", id: "delete-stream", class: "danger", text: "Delete stream" });
  delBtn.addEventListener("click", async () => {
    if (!(await confirmDialog({ title: "Delete " + name + "?", text: "The stream and its records are deleted. This cannot be undone.", confirm: "Delete", typeToConfirm: name }))) return;
    try {
      await api("DELETE", streamPath(name));
      location.hash = "#/streams";
      showBanner("");
    } catch (e) { say(actMsg, e.message); }
  });

  view.append(
    h("p", {}, h("a", { href: "#/streams", text: "← Streams" })),
    title, metaMsg,
    h("div", { class: "split" },
      h("section", { class: "panel", "aria-label": "Metadata" }, h("h2", { text: "Metadata" }), meta),
      h("section", { class: "panel", "aria-label": "Actions" }, h("h2", { text: "Append" }), appendForm,
        h("h2", { text: "Manage" }), h("div", { class: "row" }, closeBtn, h("span", { class: "row" }, trimSeq, trimBtn), delBtn), actMsg)),
    h("section", { class: "panel", "aria-label": "Live tail" }, h("div", { class: "row" }, h("h2", { class: "grow", text: "Live tail" }), follow), tailMsg, tail),
    h("section", { class: "panel", "aria-label": "Records" }, h("h2", { text: "Records" }), readForm, readMsg, list));
  loadMeta().then((ok) => {
    if (!ok) return;
    read(new URLSearchParams({ tail: 20, count: 50 }));
    runTail();
  });
};

pages.consumers = (view, page) => {
  const gBody = h("tbody");
  const sBody = h("tbody");
  const gMsg = msg("groups-msg");
  const sMsg = msg("subs-msg");
  const groups = async () => {
    try {
      const list = (await getJson("/__picomq/groups")).groups.slice(0, 200);
      const described = await Promise.all(list.map((g) => getJson("/__picomq/groups/" + encodeURIComponent(g.group)).catch((e) => ({ ...g, error: e.message }))));
      gBody.replaceChildren(...described.map((g) => h("tr", { "data-group": g.group },
        h("td", { text: g.group }),
        h("td", {}, h("a", { href: streamHref(g.stream), text: g.stream })),
        g.error ? h("td", { colspan: 7, class: "error", text: g.error }) : [
          h("td", { class: "num lag", text: g.lagBytes === null || g.lagBytes === undefined ? "–" : fmtBytes(g.lagBytes) }),
          h("td", { class: "num", text: fmtInt(g.pending) }),
          h("td", { class: "num inflight", text: fmtInt(g.inFlight) }),
          h("td", { class: "num", text: fmtInt(g.acked) }),
          h("td", { class: "num hide-narrow", text: fmtInt(g.redeliveries) }),
          h("td", { class: "num", text: fmtInt(g.deadLettered) }),
          h("td", {}, g.deadLetter ? h("a", { href: streamHref(g.deadLetter), text: g.deadLetter }) : "none"),
        ])));
      if (!described.length) gBody.append(h("tr", {}, h("td", { colspan: 9, class: "muted", text: "No consumer groups (or none this token may see)." })));
      say(gMsg, "");
    } catch (e) {
      gBody.replaceChildren();
      say(gMsg, e.message);
    }
  };
  const subs = async () => {
    try {
      const list = (await getJson("/__picomq/subscriptions")).subscriptions.slice(0, 100);
      const described = await Promise.all(list.map(async ({ path }) => {
        try {
          const s = await getJson(streamPath(path));
          const root = path.slice(0, path.length - ("__ds/subscriptions/" + s.id).length);
          let lag = 0;
          for (const link of (s.streams || []).slice(0, 20)) {
            const r = await api("HEAD", streamPath(root + link.path), { accept: [404, 410] });
            const tailPos = offsetPos(r.headers.get("stream-next-offset"));
            const acked = offsetPos(link.acked_offset);
            if (tailPos !== null && acked !== null) lag += Math.max(0, tailPos - acked);
          }
          return { ...s, path, lag };
        } catch (e) {
          return { path, error: e.message };
        }
      }));
      sBody.replaceChildren(...described.map((s) => h("tr", {},
        h("td", { class: "mono", text: s.path }),
        s.error ? h("td", { colspan: 5, class: "error", text: s.error }) : [
          h("td", { text: s.type }),
          h("td", { class: "mono", text: s.pattern || (s.streams || []).map((l) => l.path).join(", ") }),
          h("td", { class: "num", text: fmtInt((s.streams || []).length) }),
          h("td", { class: "num", text: fmtBytes(s.lag) }),
          h("td", {}, h("span", { class: "badge " + (s.status === "active" ? "ok" : "bad"), text: s.status }), s.wake && s.wake.holder ? " held by " + s.wake.holder : ""),
        ])));
      if (!described.length) sBody.append(h("tr", {}, h("td", { colspan: 6, class: "muted", text: "No subscriptions (or none this token may see)." })));
      say(sMsg, "");
    } catch (e) {
      sBody.replaceChildren();
      say(sMsg, e.message);
    }
  };
  const tBody = h("tbody");
  const tMsg = msg("tables-msg");
  const tables = async () => {
    try {
      const list = (await getJson("/__picomq/tables")).tables.slice(0, 50);
      const described = await Promise.all(list.map((t) => getJson(`/__picomq/tables/${encodeURIComponent(t.namespace)}/${encodeURIComponent(t.table)}`).catch((e) => ({ ...t, error: e.message }))));
      tBody.replaceChildren(...described.map((t) => {
        const x = t.export || {};
        const src = t.definition.source;
        return h("tr", { "data-table": `${t.namespace}.${t.table}` },
          h("td", { text: `${t.namespace}.${t.table}` }),
          h("td", { class: "mono", text: Array.isArray(src) ? src.join(", ") : src }),
          t.error ? h("td", { colspan: 5, class: "error", text: t.error }) : [
            h("td", { class: "num lag-records", text: fmtInt(t.lagRecords) }),
            h("td", { class: "num lag-seconds", text: t.lagSeconds === undefined ? "–" : t.lagSeconds.toFixed(1) + " s" }),
            h("td", { class: "num total", text: fmtInt(t.snapshot ? t.snapshot.totalRecords : 0) }),
            h("td", { text: t.snapshot ? fmtTime(t.snapshot.timestampMs) : "–" }),
            h("td", {}, x.last_error ? h("span", { class: "badge bad", text: x.last_error }) : h("span", { class: "badge ok", text: x.last_round_ms ? "exporting here" : "ok" })),
          ]);
      }));
      if (!described.length) tBody.append(h("tr", {}, h("td", { colspan: 7, class: "muted", text: "No tables (or none this token may see)." })));
      say(tMsg, "");
    } catch (e) {
      tBody.replaceChildren();
      say(tMsg, e.message);
    }
  };
  view.append(
    h("h1", { text: "Consumers" }),
    h("section", { class: "panel" }, h("h2", { text: "Consumer groups" }), gMsg,
      table("groups-table", ["Group", "Stream", "#Lag", "#Pending", "#In flight", "#Acked", "#Redeliveries", "#Dead-lettered", "Dead-letter stream"], gBody),
      h("p", { class: "muted", text: "Lag: bytes of the stream past the last message handed out. Pending: handed back, waiting for a member." })),
    h("section", { class: "panel" }, h("h2", { text: "Subscriptions" }), sMsg,
      table("subs-table", ["Subscription", "Type", "Streams", "#Linked", "#Lag", "Status"], sBody),
      h("p", { class: "muted", text: "Lag: bytes of the linked streams past what the subscription acknowledged (first 20 links)." })),
    h("section", { class: "panel" }, h("h2", { text: "Iceberg tables" }), tMsg,
      table("tables-table", ["Table", "Sources", "#Lag", "#Lag age", "#Records", "Last snapshot", "Export"], tBody),
      h("p", { class: "muted", text: "Lag: records of the source streams not yet in a snapshot, and the age of the oldest. Query the tables through the Iceberg REST catalog at /__picomq/iceberg." })));
  every(2000, groups, page);
  every(5000, subs, page);
  every(3000, tables, page);
};

pages.cluster = (view, page) => {
  const body = h("tbody");
  const past = h("tbody");
  const status = msg("cluster-msg");
  const summary = h("p", { id: "cluster-summary" });
  const identity = h("p", { id: "cluster-identity", class: "mono" });
  const load = async () => {
    let r;
    try {
      r = await getJson("/__picomq/nodes");
    } catch (e) {
      if (e.status === 404 && e.code === "not_in_cluster") {
        const ready = await api("GET", "/readyz", { accept: [503] }).then(async (x) => (await x.text()).trim()).catch((x) => x.message);
        summary.textContent = "This node runs alone (start nodes with --meta postgres://... to form a cluster). It owns every stream.";
        body.replaceChildren(h("tr", { "data-node": "self" },
          h("td", { text: location.host + " (this node)" }), h("td", { text: ready }), h("td", { text: "–" }),
          h("td", { class: "num", text: "all" }), h("td", { class: "num", text: "100%" }), h("td", { text: "–" }), h("td")));
        past.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted", text: "None: takeovers and drains happen in a cluster." })));
        say(status, "");
        return;
      }
      say(status, e.message);
      return;
    }
    const c = r.cluster || {};
    identity.textContent = `Cluster ${c.clusterId || "?"} · store ${c.store || "?"} · ${(c.meta || {}).kind || "?"} metadata ${(c.meta || {}).id || "?"}`;
    const running = r.nodes.filter((n) => !["left", "taken_over", "superseded"].includes(n.state));
    const finished = r.nodes.filter((n) => !running.includes(n));
    summary.textContent = `${running.length} running nodes share ${r.slots} slots; each stream belongs to one slot, so a node's share of slots is its share of the streams.`;
    body.replaceChildren(...running.map((n) => {
      const drain = h("button", { type: "button", class: "ghost", text: n.state === "draining" ? "Resume" : "Drain" });
      drain.addEventListener("click", async () => {
        const action = n.state === "draining" ? "resume" : "drain";
        if (!(await confirmDialog({ title: `${action === "drain" ? "Drain" : "Resume"} ${n.nodeId}?`, text: action === "drain" ? "Its streams are handed to the other nodes; it keeps running and forwards what it gets." : "It takes its share of the streams again.", confirm: action === "drain" ? "Drain" : "Resume" }))) return;
        try { await api("POST", `/__picomq/nodes/${encodeURIComponent(n.nodeId)}/${action}`); load(); } catch (e) { say(status, e.message); }
      });
      return h("tr", { "data-node": n.nodeId },
        h("td", {}, n.nodeId, n.thisNode ? " (this node)" : ""),
        h("td", {}, h("span", { class: "badge " + (n.state === "live" ? "ok" : "warn"), text: n.state })),
        h("td", { class: "num", text: n.leaseExpiresInMs > 0 ? (n.leaseExpiresInMs / 1000).toFixed(1) + " s" : "lapsed" }),
        h("td", { class: "num", text: fmtInt(n.slots) }),
        h("td", { class: "num", text: (n.share * 100).toFixed(1) + "%" }),
        h("td", { class: "mono hide-narrow", text: n.advertise }),
        h("td", {}, drain));
    }));
    past.replaceChildren(...finished.map((n) => h("tr", {},
      h("td", { text: n.nodeId }), h("td", { text: n.state.replace("_", " ") }),
      h("td", { text: n.joinedAt }), h("td", { class: "num", text: n.epoch }))));
    if (!finished.length) past.append(h("tr", {}, h("td", { colspan: 4, class: "muted", text: "No node has left or been taken over recently." })));
    say(status, "");
  };
  view.append(
    h("h1", { text: "Cluster" }), status, summary, identity,
    h("section", { class: "panel" }, h("h2", { text: "Nodes" }),
      table("nodes-table", ["Node", "State", "#Lease left", "#Slots", "#Share", "Address", ""], body)),
    h("section", { class: "panel" }, h("h2", { text: "Recent takeovers and drains" }),
      table("past-table", ["Node", "Ended as", "Joined", "#Epoch"], past)));
  every(3000, load, page);
};

// What a token may do, asked of the server (it decides; the page only reports).
const PROBES = [
  ["Overview (metrics)", "/metrics", "admin"],
  ["List streams", "/__picomq/streams?limit=1", "read on some streams"],
  ["Consumer groups", "/__picomq/groups", "subscribe on their streams"],
  ["Iceberg tables", "/__picomq/tables", "read on their sources"],
  ["Subscriptions", "/__picomq/subscriptions", "subscribe"],
  ["Cluster nodes", "/__picomq/nodes", "admin"],
  ["Manage tokens", "/__picomq/tokens", "tokens"],
];

pages.access = (view, page) => {
  const token = h("input", { id: "login-token", type: "password", autocomplete: "off", spellcheck: "false", placeholder: "pmq_…", "aria-label": "Token" });
  const loginMsg = msg("login-msg");
  const login = h("form", { class: "row", id: "login-form" },
    h("label", { class: "grow" }, "Token", token),
    h("button", { type: "submit", id: "login-submit", text: "Sign in" }),
    h("button", { type: "button", id: "logout", class: "ghost", text: "Sign out" }));
  login.addEventListener("submit", (e) => {
    e.preventDefault();
    const t = token.value.trim();
    if (!t) return say(loginMsg, "Paste a token first.");
    sessionStorage.setItem(TOKEN_KEY, t);
    token.value = "";
    sampler.samples = [];
    updateWho();
    say(loginMsg, "Signed in. The token is kept for this tab only and sent only in the Authorization header.", true);
    probe();
  });
  login.querySelector("#logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    sampler.samples = [];
    updateWho();
    say(loginMsg, "Signed out: the token is gone from this tab.", true);
    probe();
  });

  const probes = h("tbody");
  const tokensPanel = h("section", { class: "panel", id: "tokens-panel", hidden: true });
  const probe = async () => {
    const results = await Promise.all(PROBES.map(async ([what, path, needs]) => {
      try {
        await api("GET", path);
        return [what, true, "allowed"];
      } catch (e) {
        if (e.code === "auth_off") return [what, true, "allowed (authentication is off)"];
        if (e.code === "not_in_cluster") return [what, true, "allowed (this node runs alone)"];
        return [what, false, e.status === 403 ? `refused: this token lacks the ${needs} scope` : e.message];
      }
    }));
    probes.replaceChildren(...results.map(([what, ok, words]) => h("tr", {},
      h("td", { text: what }), h("td", {}, h("span", { class: "badge " + (ok ? "ok" : "bad"), text: ok ? "yes" : "no" })), h("td", { text: words }))));
    tokens();
  };

  const tBody = h("tbody");
  const tMsg = msg("tokens-msg");
  const tokens = async () => {
    let r;
    try {
      r = await getJson("/__picomq/tokens");
    } catch (e) {
      tokensPanel.hidden = false;
      tokensPanel.replaceChildren(h("h2", { text: "Tokens" }),
        h("p", { class: e.code === "auth_off" ? "muted" : "error", id: "tokens-refused", text: e.code === "auth_off" ? "Authentication is off on this server (--auth off): anyone who reaches it may do anything, and there are no tokens." : e.message }));
      return;
    }
    tBody.replaceChildren(...r.tokens.map((t) => {
      const revoke = h("button", { type: "button", class: "ghost", text: "Revoke", disabled: !!t.revokedAt, "aria-label": "Revoke " + t.id });
      revoke.addEventListener("click", async () => {
        if (!(await confirmDialog({ title: "Revoke " + t.id + "?", text: "It stops working at once, with every token issued under it.", confirm: "Revoke" }))) return;
        try { await api("DELETE", "/__picomq/tokens/" + encodeURIComponent(t.id)); say(tMsg, "Revoked " + t.id + ".", true); tokens(); } catch (e) { say(tMsg, e.message); }
      });
      return h("tr", { "data-token": t.id },
        h("td", { class: "mono", text: t.id }), h("td", { text: t.description || "–" }),
        h("td", { class: "mono", text: t.scopes.join(" ") }), h("td", { class: "mono hide-narrow", text: t.namespace || "–" }),
        h("td", { class: "hide-narrow", text: t.createdAt }), h("td", { text: t.revokedAt ? "revoked " + t.revokedAt : t.expiresAt ? "expires " + t.expiresAt : "never expires" }),
        h("td", {}, revoke));
    }));
    tokensPanel.hidden = false;
    tokensPanel.replaceChildren(h("h2", { text: "Tokens" }), tMsg,
      table("tokens-table", ["Id", "Description", "Scopes", "Namespace", "Created", "Expiry", ""], tBody), createForm, createMsg, secretBox);
  };

  const scopes = h("input", { id: "new-scopes", placeholder: "read,append:orders/** create:orders/*", autocomplete: "off", spellcheck: "false" });
  const ns = h("input", { id: "new-namespace", placeholder: "tenant-a/ (optional)", autocomplete: "off", spellcheck: "false" });
  const expires = h("input", { id: "new-expires", placeholder: "30d, 12h, 3600 (optional)", autocomplete: "off" });
  const desc = h("input", { id: "new-description", placeholder: "what it is for", autocomplete: "off" });
  const createMsg = msg("new-token-msg");
  const secretBox = h("div", { id: "new-token", hidden: true });
  const createForm = h("form", { id: "new-token-form" }, h("h3", { text: "Create a token" }),
    h("div", { class: "row" }, h("label", { class: "grow" }, "Scopes (space-separated, OPS:PATTERN)", scopes),
      h("label", {}, "Namespace", ns), h("label", {}, "Expires in", expires), h("label", { class: "grow" }, "Description", desc),
      h("button", { type: "submit", text: "Create" })));
  createForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { scopes: scopes.value.trim().split(/\s+/).filter(Boolean), description: desc.value.trim() };
    if (ns.value.trim()) body.namespace = ns.value.trim();
    const ex = expires.value.trim();
    if (ex) {
      const m = /^(\d+)\s*([smhd]?)$/.exec(ex);
      if (!m) return say(createMsg, "Expires in: a number of seconds, or with s, m, h or d (30d).");
      body.expiresInSeconds = Number(m[1]) * { "": 1, s: 1, m: 60, h: 3600, d: 86400 }[m[2]];
    }
    try {
      const t = await (await api("POST", "/__picomq/tokens", { json: body })).json();
      say(createMsg, `Created ${t.id}. Copy its secret now: it is shown only this once.`, true);
      const secret = h("input", { class: "secret", readonly: true, value: t.token, "aria-label": "The new token's secret" });
      secretBox.hidden = false;
      secretBox.replaceChildren(secret, h("button", { type: "button", class: "ghost", text: "Hide", onclick: () => { secretBox.hidden = true; secretBox.replaceChildren(); } }));
      secret.select();
      tokens();
    } catch (err) {
      say(createMsg, err.message);
    }
  });

  view.append(
    h("h1", { text: "Access" }),
    h("section", { class: "panel" }, h("h2", { text: "Sign in" }),
      h("p", { class: "muted", text: "With --auth required the console acts with a token you give it. It is kept in this tab's session storage only (gone when the tab closes) and sent only in the Authorization header, never in a URL." }),
      login, loginMsg),
    h("section", { class: "panel" }, h("h2", { text: "What this token may do" }), table("probe-table", ["Page", "Allowed", "Why"], probes)),
    tokensPanel);
  probe();
};

// ---------- routing, theme, start ----------

let current = null;

function updateWho() {
  $("who").textContent = sessionStorage.getItem(TOKEN_KEY) ? "signed in (this tab)" : "no token";
}

function route() {
  if (current) for (const f of current.cleanups) f();
  const hash = location.hash.replace(/^#\/?/, "");
  const [pathPart, queryPart] = hash.split("?");
  const [name, ...rest] = pathPart.split("/");
  const key = pages[name] && name !== "stream" ? name : name === "stream" && rest.length ? "stream" : "overview";
  let arg = rest.join("/");
  try { arg = decodeURIComponent(arg); } catch (_) { /* a malformed escape: kept as it is, refused below */ }
  const page = { cleanups: [], arg, query: new URLSearchParams(queryPart || "") };
  current = page;
  const view = $("view");
  view.replaceChildren();
  showBanner("");
  for (const a of document.querySelectorAll("nav a")) {
    const on = a.dataset.page === (key === "stream" ? "streams" : key);
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.title = (key === "stream" ? page.arg : key[0].toUpperCase() + key.slice(1)) + " · PicoMQ console";
  pages[key](view, page);
}

function applyTheme(t) {
  if (t) document.documentElement.dataset.theme = t; else delete document.documentElement.dataset.theme;
  if (current && current.redraw) current.redraw();
}

function start() {
  applyTheme(localStorage.getItem(THEME_KEY));
  $("theme").addEventListener("click", () => {
    const dark = document.documentElement.dataset.theme
      ? document.documentElement.dataset.theme === "dark"
      : window.matchMedia("(prefers-color-scheme: dark)").matches;
    const next = dark ? "light" : "dark";
    localStorage.setItem(THEME_KEY, next);
    applyTheme(next);
    for (const f of sampler.listeners) f();
  });
  updateWho();
  window.addEventListener("hashchange", route);
  if (!location.hash) location.replace("#/overview");
  route();
  // A server with auth on and no token yet: say so where it can be fixed.
  if (!sessionStorage.getItem(TOKEN_KEY)) {
    api("GET", "/__picomq/streams?limit=1").catch((e) => {
      if (e.status === 401) showBanner("This server requires a token: sign in on the Access page.");
    });
  }
}

start();
