// The dashboard page: polls /api/dashboard every 2 s and redraws (no framework, no build step).
"use strict";

const REFRESH_MS = 2000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value; // CSSOM: allowed by the page's CSP
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function duration(seconds) {
  if (!seconds || seconds <= 0) return "—";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function bytes(n) {
  if (!n) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function clock(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "";
}

function ago(ms, now) {
  if (!ms) return "";
  const s = Math.max(0, (now - ms) / 1000);
  return s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`;
}

function zoneRow(z) {
  const pct = z.partitions_total ? (100 * z.partitions_done) / z.partitions_total : 0;
  const bar = el("div", { class: "progress" },
    el("div", { class: z.state === "READY" ? "bar" : "bar moving" },
      el("span", { style: `width: ${pct.toFixed(1)}%` })),
    el("em", {}, `${z.partitions_done} / ${z.partitions_total} stable`));
  let eta = duration(z.eta_s);
  if (z.state === "HOLDDOWN") eta = `holddown ${duration(z.holddown_remaining_s)}`;
  const left = z.bytes_to_move ? el("div", { class: "muted small" }, `${bytes(z.bytes_to_move)} to copy`) : null;
  const details = el("div", { class: "details" }, ...z.details.map((d) => el("div", {}, d)));
  const nodes = el("td", { class: "num" }, z.eligible_nodes,
    z.under_replicated ? el("span", { class: "tag warn" }, "under-replicated") : null);
  return el("tr", { "data-zone": z.name, "data-state": z.state },
    el("td", { class: "name" }, z.name),
    el("td", {}, el("span", { class: `state ${z.state}` }, z.state)),
    el("td", {}, bar),
    el("td", {}, eta, left),
    el("td", { class: "num" }, `${z.partitions} × ${z.replicas}`,
      z.failure_domain ? el("span", { class: "tag" }, z.failure_domain) : null),
    nodes,
    el("td", { class: "num" }, z.moving),
    el("td", {}, details));
}

function heatColor(value, max) {
  if (!value || !max) return "";
  const t = value / max; // light → deep blue
  const light = 94 - 52 * t;
  return `background: hsl(212, 85%, ${light.toFixed(0)}%); color: ${t > 0.6 ? "#fff" : "#1f2328"}`;
}

function drawHeatmap(doc) {
  const zones = doc.zones.map((z) => z.name);
  const head = document.querySelector("#heatmap thead tr");
  head.replaceChildren(el("th", {}, "node"), el("th", {}, "address"),
    ...zones.map((z) => el("th", { class: "center", "data-zone": z }, z)),
    el("th", { class: "num" }, "replicas"), el("th", { class: "num" }, "primaries"));
  const max = {};
  for (const z of zones) {
    max[z] = Math.max(0, ...doc.nodes.map((n) => (n.zones[z] || {}).replicas || 0));
  }
  fill(document.querySelector("#heatmap tbody"), doc.nodes.map((n) => {
    const tags = [];
    if (!n.registered) tags.push(el("span", { class: "tag bad" }, "not registered"));
    if (n.draining) tags.push(el("span", { class: "tag warn" }, "draining"));
    if (n.cordoned) tags.push(el("span", { class: "tag warn" }, "cordoned"));
    if (n.stopping) tags.push(el("span", { class: "tag warn" }, "stopping"));
    const attrs = Object.entries(n.attributes).map(([k, v]) => `${k}=${v}`).join(" ");
    const cells = zones.map((z) => {
      const c = n.zones[z] || { replicas: 0, primaries: 0 };
      if (!c.replicas && !c.primaries) return el("td", { class: "cell empty", "data-zone": z }, "·");
      return el("td", { class: "cell", "data-zone": z, style: heatColor(c.replicas, max[z]) },
        c.replicas, c.primaries ? el("span", { class: "star" }, `★${c.primaries}`) : null);
    });
    return el("tr", { "data-node": n.name },
      el("td", { class: "name" }, n.name, ...tags),
      el("td", { class: "mono" }, n.address, attrs ? el("span", { class: "tag" }, attrs) : null),
      ...cells,
      el("td", { class: "num" }, n.replicas),
      el("td", { class: "num" }, n.primaries));
  }));
}

function peers(list, marked, cls) {
  const span = el("span", { class: "mono" });
  list.forEach((name, i) => {
    if (i) span.append(", ");
    span.append(marked.includes(name) ? el("span", { class: cls }, name) : name);
  });
  return span;
}

function drawRebalances(doc) {
  const rows = doc.rebalances.map((r) => el("tr", { "data-zone": r.zone, "data-partition": r.partition },
    el("td", { class: "name" }, r.zone),
    el("td", { class: "num" }, r.partition),
    el("td", {}, peers(r.old, r.leaving, "leave")),
    el("td", { class: "muted" }, "→"),
    el("td", {}, peers(r.new, r.joining, "join"),
      !r.joining.length && !r.leaving.length
        ? el("div", { class: "muted small" }, "same replicas, new preferred primary") : null,
      r.planned ? el("div", { class: "muted small" }, `then ${r.planned.join(", ")}`) : null),
    el("td", { class: "mono join" }, r.joining.join(", ")),
    el("td", { class: "mono leave" }, r.leaving.join(", ")),
    el("td", { class: "mono" }, r.done.join(", "),
      r.failed.length ? el("span", { class: "tag bad" }, `failed: ${r.failed.join(", ")}`) : null,
      r.cancelling ? el("span", { class: "tag warn" }, "cancelling") : null),
    el("td", { class: "num mono" }, r.revision),
    el("td", { class: "muted" }, ago(r.started_ms, doc.generated_ms))));
  fill(document.querySelector("#rebalances tbody"), rows);
  document.getElementById("rebalances").hidden = rows.length === 0;
  document.getElementById("rebalances-empty").hidden = rows.length !== 0;
  const more = doc.rebalances_total - doc.rebalances.length;
  document.getElementById("rebalances-count").textContent =
    doc.rebalances_total ? `${doc.rebalances_total} partitions${more > 0 ? ` (first ${doc.rebalances.length} shown)` : ""}` : "";
}

function drawHistory(doc) {
  fill(document.querySelector("#history tbody"), doc.history.map((c) => el("tr", { "data-kind": c.kind },
    el("td", { class: "num mono" }, c.revision),
    el("td", { class: "muted" }, clock(c.ts_ms)),
    el("td", { class: "name" }, c.zone || ""),
    el("td", {}, c.text))));
}

function draw(doc) {
  fill(document.querySelector("#zones tbody"), doc.zones.map(zoneRow));
  document.getElementById("zones-empty").hidden = doc.zones.length !== 0;
  drawHeatmap(doc);
  drawRebalances(doc);
  drawHistory(doc);
  const leader = doc.leader ? `leader ${doc.leader}` : "NO LEADER";
  const role = doc.leading ? "leader" : "follower";
  document.getElementById("where").textContent =
    `served by ${doc.driver} (${role}) · ${leader}${doc.paused ? " · rebalancing PAUSED" : ""} · etcd revision ${doc.revision}`;
  document.body.dataset.revision = doc.revision;
}

function live(state, text) {
  document.getElementById("live").dataset.live = state;
  document.getElementById("live-text").textContent = text;
}

async function refresh() {
  try {
    const answer = await fetch("/api/dashboard", { cache: "no-store" });
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.error || answer.statusText);
    draw(body);
    live("ok", `updated ${clock(body.generated_ms)}`);
  } catch (e) {
    live("stale", `not updated: ${e.message}`);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
