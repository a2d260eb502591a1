// Cordon's dashboard: reads GET /v1/health once and follows GET /v1/events (server-sent
// events: `stats` snapshots and `audit` rows) with the API key the user gives. Every value
// from the server is put on the page as text (textContent), never as markup.
"use strict";

const KEEP_ROWS = 50;
const KEEP_POINTS = 120;
const state = {
  key: "",
  execs: [],      // recent exec rows, newest first
  egress: [],     // recent denials and exfiltration refusals, newest first
  starts: [],     // [time_ms, start_us] of creates that were cold starts
  runs: [],       // [time_ms, run_us] of execs
  seen: new Set(),
  counts: { exec: 0, deny: 0, exfil: 0 },
  snapshot: null,
};

function $(id) { return document.getElementById(id); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function fill(tableId, rows, emptyText, columns) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = row([]);
    tr.className = "empty-row";
    const td = el("td", emptyText);
    td.colSpan = columns;
    tr.appendChild(td);
    body.appendChild(tr);
    return;
  }
  for (const r of rows) body.appendChild(r);
}

function ms(us) {
  if (us === undefined || us === null) return "";
  const v = us / 1000;
  return v >= 100 ? `${v.toFixed(0)} ms` : `${v.toFixed(1)} ms`;
}

function bytes(n) {
  if (!n) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function clock(t) { return new Date(t).toLocaleTimeString(); }

function age(created) {
  const s = Math.max(0, Math.round((Date.now() - created) / 1000));
  return s < 120 ? `${s}s` : `${Math.round(s / 60)}m`;
}

function mono(text) { return el("td", text, "mono"); }

function renderSnapshot() {
  const s = state.snapshot;
  if (!s) return;
  $("who").textContent = s.scope === "all" ? `operator view (key of ${s.tenant})` : `tenant ${s.tenant}`;
  $("live-total").textContent = String(s.sandboxes.length);
  fill("live-counts", s.live.map((c) => row([c.tier, c.tenant, String(c.count)])), "no live sandboxes", 3);
  fill("pools", s.pools.map((p) => {
    const bar = el("td");
    const width = 120;
    const full = p.size ? Math.round((width * Math.min(p.ready, p.size)) / p.size) : 0;
    const a = el("span", null, "bar"); a.style.width = `${full}px`;
    const b = el("span", null, "bar empty"); b.style.width = `${width - full}px`;
    bar.append(a, b);
    return row([p.tier, String(p.ready), String(p.size), bar]);
  }), "no warm pools configured", 4);
  fill("sandboxes", s.sandboxes.map((b) => row([
    mono(b.id), b.tier, b.tenant, b.busy ? `${b.state} (busy)` : b.state, b.source,
    ms(b.start_us), age(b.created_ms),
  ])), "no live sandboxes", 7);
}

function renderRows() {
  $("exec-total").textContent = String(state.counts.exec);
  $("deny-total").textContent = String(state.counts.deny);
  $("exfil-total").textContent = String(state.counts.exfil);
  fill("execs", state.execs.map((e) => {
    const d = e.detail || {};
    const term = d.termination || (d.error ? "error" : "");
    const usage = d.usage || {};
    return row([
      clock(e.time_ms), mono(e.sandbox || ""), e.tier || "",
      el("td", term, `t-${term}`),
      d.exit_code === null || d.exit_code === undefined ? (d.signal ? `signal ${d.signal}` : "") : String(d.exit_code),
      ms(d.timings && d.timings.run_us), ms(usage.cpu_time_us), bytes(usage.peak_memory_bytes),
    ]);
  }), "no executions yet", 8);
  fill("egress", state.egress.map((e) => {
    const d = e.detail || {};
    return row([
      clock(e.time_ms), mono(e.sandbox || ""), el("td", e.decision, `d-${e.decision}`),
      d.host ? `${d.host}${d.port ? ":" + d.port : ""}` : "", d.rule || "", d.reason || "",
      String(d.count || 1),
    ]);
  }), "no egress denied", 7);
  renderChart();
}

function renderChart() {
  const svg = $("chart");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const W = 800, H = 220, L = 50, R = 10, T = 10, B = 25;
  const all = state.starts.concat(state.runs);
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("class", "axis");
  axis.setAttribute("d", `M${L},${T} V${H - B} H${W - R}`);
  svg.appendChild(axis);
  if (all.length === 0) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", String(L + 10)); t.setAttribute("y", String(H / 2));
    t.textContent = "no starts or execs yet";
    svg.appendChild(t);
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]), t0 + 1000);
  const lo = Math.log10(Math.max(1, Math.min(...all.map((p) => p[1]))) / 1000);
  const hi = Math.log10(Math.max(...all.map((p) => p[1]), 10) / 1000);
  const span = Math.max(hi - Math.floor(lo), 1);
  const base = Math.floor(lo);
  const x = (t) => L + ((W - L - R) * (t - t0)) / (t1 - t0);
  const y = (us) => H - B - ((H - T - B) * (Math.log10(Math.max(us, 1) / 1000) - base)) / span;
  for (let d = base; d <= base + Math.ceil(span); d++) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", "4"); t.setAttribute("y", String(y(Math.pow(10, d) * 1000) + 4));
    t.textContent = d >= 3 ? `${Math.pow(10, d - 3)} s` : `${Math.pow(10, d)} ms`;
    svg.appendChild(t);
  }
  for (const [points, cls] of [[state.starts, "start"], [state.runs, "run"]]) {
    if (points.length === 0) continue;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", cls);
    line.setAttribute("points", points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
    svg.appendChild(line);
    for (const p of points) {
      const c = document.createElementNS(ns, "circle");
      c.setAttribute("class", cls);
      c.setAttribute("cx", x(p[0]).toFixed(1)); c.setAttribute("cy", y(p[1]).toFixed(1)); c.setAttribute("r", "2.5");
      svg.appendChild(c);
    }
  }
}

function push(list, item, keep) {
  list.unshift(item);
  if (list.length > keep) list.length = keep;
}

function point(list, p) {
  list.push(p);
  if (list.length > KEEP_POINTS) list.shift();
}

function onAudit(e) {
  if (state.seen.has(e.id)) return;
  state.seen.add(e.id);
  const d = e.detail || {};
  if (e.kind === "exec") {
    state.counts.exec++;
    push(state.execs, e, KEEP_ROWS);
    if (d.timings && d.timings.run_us) point(state.runs, [e.time_ms, d.timings.run_us]);
  } else if (e.kind === "create" && d.start_us) {
    point(state.starts, [e.time_ms, d.start_us]);
  } else if (e.kind === "egress" && (e.decision === "deny" || e.decision === "exfiltration")) {
    if (e.decision === "deny") state.counts.deny += d.count || 1;
    else state.counts.exfil += d.count || 1;
    push(state.egress, e, KEEP_ROWS);
  }
}

function connected(on, text) {
  const c = $("conn");
  c.textContent = text;
  c.className = `status ${on ? "on" : "off"}`;
}

function headers() {
  return { Authorization: `Bearer ${state.key}` };
}

async function health() {
  const r = await fetch("/v1/health", { headers: headers() });
  if (!r.ok) return;
  const h = await r.json();
  if (h.version) document.title = `Cordon ${h.version} dashboard`;
}

// Follows the event stream; on a drop it connects again after a pause.
async function follow() {
  let renderQueued = false;
  const render = () => {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => { renderQueued = false; renderSnapshot(); renderRows(); });
  };
  for (;;) {
    try {
      const r = await fetch("/v1/events", { headers: { ...headers(), Accept: "text/event-stream" } });
      if (r.status === 401) {
        connected(false, "the API key was refused");
        sessionStorage.removeItem("cordon-key");
        showLogin();
        return;
      }
      if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
      connected(true, "live");
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let name = "message", data = "";
          for (const line of frame.split("\n")) {
            if (line.startsWith("event:")) name = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trimStart();
          }
          if (!data) continue;
          const v = JSON.parse(data);
          if (name === "stats") state.snapshot = v;
          else if (name === "audit") onAudit(v);
          render();
        }
      }
      connected(false, "stream ended; reconnecting");
    } catch (err) {
      connected(false, `disconnected (${err.message}); reconnecting`);
    }
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

function showLogin() {
  $("board").hidden = true;
  $("login").hidden = false;
}

function start(key) {
  state.key = key;
  sessionStorage.setItem("cordon-key", key);
  $("login").hidden = true;
  $("board").hidden = false;
  renderSnapshot();
  renderRows();
  health().catch(() => {});
  follow();
}

document.addEventListener("DOMContentLoaded", () => {
  const m = location.hash.match(/^#key=(.+)$/);
  if (m) {
    history.replaceState(null, "", location.pathname);
    start(decodeURIComponent(m[1]));
    return;
  }
  const saved = sessionStorage.getItem("cordon-key");
  if (saved) { start(saved); return; }
  showLogin();
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const k = $("key").value.trim();
    if (k) start(k);
  });
});
