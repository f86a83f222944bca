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

// Quorum ids and order ids ("o" and a number) are 13-digit numbers (the first one is the
// time in ms): every one of them, wherever it appears, is shown the same way, by its last
// digits (never wrapped), the whole id in the title.
const LONG_ID = /\bo?\d{10,}\b/g;
const SHORT_DIGITS = 5;

function shortId(id) {
  const text = String(id);
  const prefix = text.startsWith("o") ? "o" : "";
  const digits = text.slice(prefix.length);
  const node = el("span", digits.length > SHORT_DIGITS + 1 ? prefix + "…" + digits.slice(-SHORT_DIGITS) : text, "qid");
  node.title = text;
  return node;
}

// Text with every long number in it shown short (as text nodes and spans, never as HTML).
function withShortIds(text) {
  const out = [];
  let last = 0;
  for (const m of String(text).matchAll(LONG_ID)) {
    out.push(document.createTextNode(text.slice(last, m.index)), shortId(m[0]));
    last = m.index + m[0].length;
  }
  out.push(document.createTextNode(String(text).slice(last)));
  return out;
}

function cell(content, className) {
  const td = el("td", undefined, className);
  if (Array.isArray(content)) td.append(...content);
  else if (content instanceof Node) td.append(content);
  else td.textContent = content === null || content === undefined ? "–" : String(content);
  return td;
}

function badge(state) { return el("span", state, "state state-" + state); }

// A table's rows, or one row saying there are none.
function fill(table, rows, none) {
  if (rows.length === 0) {
    const td = el("td", none, "muted none");
    td.colSpan = table.tHead.rows[0].cells.length;
    const row = el("tr");
    row.append(td);
    rows = [row];
  }
  table.tBodies[0].replaceChildren(...rows);
}

// "host h1 died: ..." in the row of host h1 reads "died: ..." (a job is named with its id
// quoted: 'job "job" COMPLETED' reads "COMPLETED").
function withoutSubject(message, noun, subject) {
  for (const named of [noun + " " + subject, noun + ' "' + subject + '"']) {
    if (message.startsWith(named + " ") || message.startsWith(named + ":")) {
      return message.slice(named.length).replace(/^:?\s*/, "");
    }
  }
  return message;
}

// A step number: -1 (nothing committed yet) reads "none yet".
function stepText(step) { return step < 0 ? "none yet" : String(step); }

// How the replicas meet (the job's sync_mode): every step, or every sync_every_steps inner steps,
// when a step of the protocol (the committed step, the step rate) is one sync.
function semiSynchronous(job) { return (job.sync_mode || "sync") !== "sync"; }

function syncText(job) {
  if (!semiSynchronous(job)) return "every step (sync)";
  const text = job.sync_mode + ": a sync every " + job.sync_every_steps + " inner steps";
  return (job.sync_fragments || 1) > 1 ? text + " in " + job.sync_fragments + " fragments" : text;
}

// RUNNING while no replica can make progress: FAILING, FAILED when its countdown ends.
function shownState(job) { return job.job_state === "RUNNING" && job.failing ? "FAILING" : job.job_state; }

function jobReason(job) {
  if (job.job_state_reason) return job.job_state_reason;  // FAILING: why, and the seconds left
  const total = job.replicas_total;
  if (job.job_state === "COMPLETED") {
    return "completed at " + time(job.completed_at) + ": " + job.replicas_finished + " of " + total +
           " replicas finished, " + job.replicas_dead + " dead";
  }
  if (job.job_state === "RUNNING") {
    const parts = [job.replicas_healthy + " of " + total + " replicas healthy"];
    if (job.replicas_behind) parts.push(job.replicas_behind + " catching up");
    if (job.replicas_joining) parts.push(job.replicas_joining + " joining");
    if (job.replicas_dead) parts.push(job.replicas_dead + " dead");
    if (job.replicas_diverged) parts.push(job.replicas_diverged + " diverged");
    return "training: " + parts.join(", ");
  }
  return "";
}

function renderJob(job) {
  $("job-id").textContent = job.job_id;
  const state = shownState(job);
  $("job-card").dataset.state = state;
  $("job-card").dataset.failsIn = job.fails_in_s === null ? "" : job.fails_in_s;
  $("job-state").textContent = state;
  $("job-countdown").textContent = state === "FAILING" ? "FAILED in " + fmt(job.fails_in_s, 0) + " s" : "";
  $("job-state").className = "state state-" + state;
  $("job-reason").replaceChildren(...withShortIds(jobReason(job)));
  $("committed-step").textContent = stepText(job.committed_step);
  const semi = semiSynchronous(job);
  $("committed-label").textContent = semi ? "committed sync" : "committed step";
  $("step-rate-label").textContent = semi ? "syncs / s" : "steps / s";
  $("sync-mode").textContent = syncText(job);
  $("sync-mode").dataset.mode = job.sync_mode || "sync";
  const running = job.job_state === "RUNNING";
  $("healthy-label").textContent = running ? "healthy replicas" : "finished replicas";
  $("healthy").textContent = (running ? job.replicas_healthy : job.replicas_finished) + " / " + job.replicas_total;
  $("ett").textContent = job.telemetry ? percent(job.goodput.effective_training_ratio) : "off";
  $("step-rate").textContent = job.telemetry ? fmt(job.goodput.committed_steps_per_s, 2) : "off";
  $("quorum-id").replaceChildren(job.quorum_id ? shortId(job.quorum_id) : "–");
  $("spares").textContent = job.spares_free;
  $("leader").textContent = job.leader || "?";
  $("round-reason").replaceChildren(...withShortIds(job.round.reason));
  // a job without a durable checkpoint: "a failure of every replica restarts from step 0"
  $("checkpoint-warning").textContent = job.checkpoint_warning || "";
  $("checkpoint-warning").hidden = !job.checkpoint_warning;
}

function renderStalls(report) {
  $("stall-rule").textContent = "A stall is a pause of the committed step of at least " + fmt(report.threshold_s, 1) +
    " s (3 typical steps" + (report.typical_step_s === null ? "" : " of " + fmt(report.typical_step_s, 2) + " s") +
    ", at least 1 s).";
  fill($("stalls"), report.stalls.slice(-10).reverse().map((s) => {
    const row = el("tr");
    row.dataset.seconds = s.seconds;
    row.dataset.ongoing = s.ongoing;
    const went = s.quorum_id ? [document.createTextNode("quorum "), shortId(s.quorum_id),
                                ...withShortIds(": " + s.quorum_reason)] : (s.ongoing ? "still standing still" : "–");
    row.append(cell(time(s.start)), cell(fmt(s.seconds, 1) + (s.ongoing ? " and counting" : ""), "num"),
               cell(s.step, "num"), cell(s.failures.map((f) => f.replica).join(", ") || "none recorded"), cell(went));
    return row;
  }), "no stall in the recent timeline");
  fill($("failures"), report.failures.slice(-10).reverse().map((f) => {
    const row = el("tr");
    row.dataset.replica = f.replica;
    row.dataset.stall = f.stall ? f.stall.seconds : "";
    const stood = f.stall ? fmt(f.stall.seconds, 1) + (f.stall.ongoing ? " and counting" : "") : "–";
    row.append(cell(f.replica), cell(f.cause), cell(time(f.died_at)), cell(fmt(f.detect_s, 2), "num"),
               cell(f.recover_s === null ? "recovering" : fmt(f.recover_s, 2), "num"), cell(stood, "num stall"));
    return row;
  }), "no failure recorded");
}

function renderHosts(hosts) {
  fill($("hosts"), hosts.map((h) => {
    const row = el("tr");
    row.dataset.host = h.host_id;
    row.dataset.state = h.state;
    row.dataset.cordoned = h.cordoned;
    const role = h.state === "CORDONED" ? (h.assignment ? "waits for a spare to take its work" : "cordoned: out of the spare pool")
                 : h.assignment ? "active" : h.spare ? (h.standby ? "spare, standby trainers" : "spare") : "–";
    const assignment = h.assignment ? "replica " + h.assignment.replica_id + ", ranks " + h.assignment.ranks.join(",") +
                                      " of " + h.assignment.world_size : "–";
    const cordon = h.cordoned ? "yes (" + (h.cordoned_by || "?") + ")" + (h.cordon_reason ? ": " + h.cordon_reason : "") : "no";
    row.append(cell(h.host_id), cell(badge(h.state)), cell(role), cell(assignment), cell(cordon, h.cordoned ? "cordoned" : ""),
               cell(fmt(h.seconds_since_seen, 1), "num"), cell(withoutSubject(h.state_reason || "", "host", h.host_id)));
    return row;
  }), "no host registered");
}

// Every replica the job has, joined or not (the REST list), and a line for those not seen yet.
function renderReplicas(replicas, job) {
  const goodput = job.goodput;
  const rows = replicas.map((r) => {
    const row = el("tr");
    row.dataset.replica = r.replica_id;
    row.dataset.state = r.state;
    const state = cell(badge(r.state));
    const mine = goodput.replicas[r.replica_id];
    row.append(el("td", r.replica_id), state, el("td", r.step, "num"), el("td", stepText(r.committed_step), "num"),
               el("td", r.last_loss === null ? "–" : r.last_loss.toPrecision(4), "num"),
               el("td", mine ? percent(mine.effective_training_ratio) : "–", "num"),
               el("td", fmt(r.seconds_since_seen, 1), "num"), cell(withShortIds(r.reason)));
    return row;
  });
  const unseen = job.replicas_total - replicas.length;
  if (unseen > 0) {
    const td = el("td", unseen + " more configured replica(s) not seen yet: no host runs them and none joined",
                  "muted unseen");
    td.colSpan = $("replicas").tHead.rows[0].cells.length;
    const row = el("tr");
    row.append(td);
    rows.push(row);
  }
  fill($("replicas"), rows, "no replica yet");
}

function renderQuorum(quorums) {
  const q = quorums.current;
  const p = $("quorum");
  if (!q) { p.textContent = "no quorum yet"; return; }
  const members = q.members.map((m) => m.replica_id + (m.healthy ? "" : " (behind)")).join(", ");
  p.replaceChildren("quorum ", shortId(q.quorum_id), " at step " + q.max_step + ", lr scale " + q.lr_scale.toFixed(3) +
                    ": " + members + " — ", ...withShortIds(q.reason));
}

// An event's message usually starts by naming its subject ("replica r1 registered", "job job
// COMPLETED" for a job named "job"): the subject has its own column, so that is not repeated.
const SUBJECT_NOUNS = ["replica", "host", "job", "quorum"];

function eventWhat(e) {
  for (const noun of SUBJECT_NOUNS) {
    const what = withoutSubject(e.message, noun, e.subject);
    if (what !== e.message) return what;
  }
  return e.message;
}

function renderEvents(events) {
  $("events").tBodies[0].replaceChildren(...events.slice().reverse().map((e) => {
    const row = el("tr", undefined, "level-" + e.level);
    row.dataset.kind = e.kind;
    row.title = e.kind + (e.cause ? " (" + e.cause + ")" : "");
    row.append(cell(time(e.at)), cell(e.level), cell(withShortIds(e.subject)), cell(withShortIds(eventWhat(e))));
    return row;
  }));
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// Round numbers for an axis from 0 to `max`: about `count` of them.
function ticks(max, count) {
  const raw = Math.max(max, 1) / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * power).find((m) => m >= raw);
  const out = [];
  for (let v = 0; v <= max + 1e-9; v += step) out.push(Math.round(v * 1e6) / 1e6);
  return out;
}

// The chart is drawn at the width it has on the page (one SVG unit a pixel): it fills its
// section, and each line has its own scale: committed step on the left, healthy replicas on
// the right, time below.
function renderChart(history, total, stalls) {
  const chart = $("chart");
  const W = Math.max(Math.round(chart.getBoundingClientRect().width), 300), H = 220, L = 56, R = 56, T = 24, B = 28;
  chart.setAttribute("viewBox", "0 0 " + W + " " + H);
  const nodes = [svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
                 svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
                 svg("line", { x1: W - R, y1: T, x2: W - R, y2: H - B, class: "axis" })];
  const label = (x, y, text, className, anchor) => {
    const node = svg("text", { x: x, y: y, class: className, "text-anchor": anchor });
    node.textContent = text;
    nodes.push(node);
  };
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
    for (const s of stalls) {
      const a = Math.max(s.start, t0), b = Math.min(s.end, t1);
      if (b > a) nodes.push(svg("rect", { x: x(a), y: T, width: Math.max(x(b) - x(a), 1), height: H - B - T, class: "stall" }));
    }
    nodes.push(svg("polyline", { points: stepPoints, class: "step" }),
               svg("polyline", { points: healthyPoints.trim(), class: "healthy" }));
    for (const v of ticks(maxStep, 4)) label(L - 6, yStep(v) + 4, v, "tick tick-step", "end");
    for (const v of ticks(maxHealthy, Math.min(maxHealthy, 4))) label(W - R + 6, yHealthy(v) + 4, v, "tick tick-replicas", "start");
    for (const f of [0, 0.5, 1]) label(x(t0 + f * (t1 - t0)), H - 8, time(t0 + f * (t1 - t0)), "tick tick-time", f === 0 ? "start" : f === 1 ? "end" : "middle");
    label(L - 6, 12, "step", "axis-name", "end");
    label(W - R + 6, 12, "replicas", "axis-name", "start");
  }
  chart.replaceChildren(...nodes);
  chart.dataset.samples = history.length;
}

async function refresh() {
  try {
    const [job, replicas, hosts, quorums, events, history, stalls] = await Promise.all([
      get("/api/v1/job"), get("/api/v1/replicas"), get("/api/v1/hosts"), get("/api/v1/quorums"),
      get("/api/v1/events?limit=20"), get("/api/v1/history"), get("/api/v1/stalls")]);
    renderJob(job);
    renderReplicas(replicas, job);
    renderHosts(hosts);
    renderQuorum(quorums);
    renderStalls(stalls);
    renderEvents(events);
    renderChart(history, job.replicas_total, stalls.stalls);
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
