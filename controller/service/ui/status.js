// The controller's status page: polls the REST API and redraws in place. Every value from
// the API is set as text (never as HTML): event messages can carry text from agents.
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "fthsdp-read-token";
const $ = (id) => document.getElementById(id);

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

async function get(path) {
  const reply = await fetch(path, { headers: headers(), cache: "no-store" });
  if (reply.status === 401 || reply.status === 403) {
    $("token-form").hidden = false;
    throw new Error(path + " answered " + reply.status + ": a read token is needed");
  }
  if (!reply.ok) throw new Error(path + " answered " + reply.status);
  return reply.json();
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" ? value.toFixed(digits) : String(value);
}

function percent(ratio) { return (100 * ratio).toFixed(1) + " %"; }

function time(at) { return at ? new Date(at * 1000).toLocaleTimeString() : "–"; }

function renderJob(job) {
  $("job-id").textContent = job.job_id;
  $("committed-step").textContent = job.committed_step;
  $("healthy").textContent = job.replicas_healthy + " / " + job.replicas_total;
  $("ett").textContent = job.telemetry ? percent(job.goodput.effective_training_ratio) : "off";
  $("step-rate").textContent = job.telemetry ? fmt(job.goodput.committed_steps_per_s, 2) : "off";
  $("quorum-id").textContent = job.quorum_id;
  $("spares").textContent = job.spares_free;
  $("leader").textContent = job.leader || "?";
  $("round-reason").textContent = job.round.reason;
  const body = $("failures").tBodies[0];
  body.replaceChildren(...job.goodput.recent_failures.slice(-10).reverse().map((f) => {
    const row = el("tr");
    row.append(el("td", f.replica), el("td", f.cause), el("td", time(f.died_at)),
               el("td", fmt(f.detect_s, 2), "num"), el("td", f.recover_s === null ? "recovering" : fmt(f.recover_s, 2), "num"));
    return row;
  }));
}

function renderReplicas(replicas, goodput) {
  const body = $("replicas").tBodies[0];
  body.replaceChildren(...replicas.map((r) => {
    const row = el("tr");
    row.dataset.replica = r.replica_id;
    row.dataset.state = r.state;
    const state = el("td");
    state.append(el("span", r.state, "state state-" + r.state));
    const mine = goodput.replicas[r.replica_id];
    row.append(el("td", r.replica_id), state, el("td", r.step, "num"), el("td", r.committed_step, "num"),
               el("td", r.last_loss === null ? "–" : r.last_loss.toPrecision(4), "num"),
               el("td", mine ? percent(mine.effective_training_ratio) : "–", "num"),
               el("td", fmt(r.seconds_since_seen, 1), "num"), el("td", r.reason));
    return row;
  }));
}

function renderQuorum(quorums) {
  const q = quorums.current;
  const p = $("quorum");
  if (!q) { p.textContent = "no quorum yet"; return; }
  const members = q.members.map((m) => m.replica_id + (m.healthy ? "" : " (behind)")).join(", ");
  p.textContent = "quorum " + q.quorum_id + " at step " + q.max_step + ", lr scale " + q.lr_scale.toFixed(3) +
                  ": " + members + " — " + q.reason;
}

function renderEvents(events) {
  $("events").replaceChildren(...events.slice().reverse().map((e) => {
    const item = el("li", time(e.at) + "  " + e.level.toUpperCase() + "  " + e.kind + "  " + e.message,
                    "level-" + e.level);
    item.dataset.kind = e.kind;
    return item;
  }));
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function renderChart(history, total) {
  const chart = $("chart");
  const W = 800, H = 220, L = 50, R = 40, T = 10, B = 25;
  const nodes = [svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
                 svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" })];
  if (history.length > 0) {
    const t0 = history[0][0], t1 = Math.max(history[history.length - 1][0], t0 + 1);
    const maxStep = Math.max(1, ...history.map((s) => s[1]));
    const maxHealthy = Math.max(1, total, ...history.map((s) => s[2]));
    const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
    const yStep = (v) => H - B - (H - B - T) * Math.max(v, 0) / maxStep;
    const yHealthy = (v) => H - B - (H - B - T) * v / maxHealthy;
    const stepPoints = history.map((s) => x(s[0]) + "," + yStep(s[1])).join(" ");
    let healthyPoints = "";
    history.forEach((s, i) => {
      if (i > 0) healthyPoints += x(s[0]) + "," + yHealthy(history[i - 1][2]) + " ";
      healthyPoints += x(s[0]) + "," + yHealthy(s[2]) + " ";
    });
    nodes.push(svg("polyline", { points: stepPoints, class: "step" }),
               svg("polyline", { points: healthyPoints.trim(), class: "healthy" }));
    const labels = [[4, T + 10, "step " + maxStep], [4, H - B, "0"], [W - R + 4, T + 10, maxHealthy + " rep."],
                    [L, H - 6, time(t0)], [W - R - 60, H - 6, time(t1)]];
    for (const [lx, ly, text] of labels) {
      const label = svg("text", { x: lx, y: ly });
      label.textContent = text;
      nodes.push(label);
    }
  }
  chart.replaceChildren(...nodes);
  chart.dataset.samples = history.length;
}

async function refresh() {
  try {
    const [job, replicas, quorums, events, history] = await Promise.all([
      get("/api/v1/job"), get("/api/v1/replicas"), get("/api/v1/quorums"), get("/api/v1/events?limit=20"),
      get("/api/v1/history")]);
    renderJob(job);
    renderReplicas(replicas, job.goodput);
    renderQuorum(quorums);
    renderEvents(events);
    renderChart(history, job.replicas_total);
    $("problem").hidden = true;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  } catch (err) {
    $("problem").hidden = false;
    $("problem").textContent = "cannot refresh: " + err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token-form").hidden = true;
    refresh();
  });
  refresh();
  setInterval(refresh, REFRESH_MS);
});
