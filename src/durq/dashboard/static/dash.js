// durq dashboard: confirmations, live queue and limit counts and the throughput chart.
// No libraries and no inline script (the page's CSP forbids both); all text goes through
// textContent, never innerHTML.
(function () {
  "use strict";
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";
  const refresh = Math.max(2, parseFloat(meta("durq-refresh")) || 5) * 1000;
  const SVG = "http://www.w3.org/2000/svg";

  // Every action form asks first.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    const question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  // Task tables: one box ticks every task of the page.
  const pickAll = document.getElementById("pick-all");
  if (pickAll) {
    pickAll.addEventListener("change", () => {
      for (const box of document.querySelectorAll('input[name="id"][form="selection"]')) {
        box.checked = pickAll.checked;
      }
    });
  }

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`${response.status}`);
    return response.json();
  }

  function age(seconds) {
    if (!seconds || seconds <= 0) return "-";
    const s = Math.floor(seconds), pad = (n) => String(n).padStart(2, "0");
    if (s >= 86400) return `${Math.floor(s / 86400)}d ${pad(Math.floor((s % 86400) / 3600))}h`;
    if (s >= 3600) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
    if (s >= 60) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
    return `${s}s`;
  }

  // Overview: refresh the numbers of the queue table in place.
  const table = document.getElementById("queues");
  async function refreshQueues() {
    try {
      const data = await getJSON(table.dataset.source);
      const sums = { pending: 0, active: 0, retry: 0, archived: 0, processed: 0, failed: 0 };
      for (const q of data.queues) {
        for (const key of ["pending", "active", "retry", "archived"]) sums[key] += q.sizes[key] || 0;
        sums.processed += q.processed_today || 0;
        sums.failed += q.failed_today || 0;
        const row = Array.from(table.tBodies[0].rows).find((r) => r.dataset.queue === q.name);
        if (!row) continue;  // a new queue: shown on the next page load
        for (const cell of row.querySelectorAll("[data-field]")) {
          const field = cell.dataset.field;
          let value;
          if (field === "oldest") value = age(q.oldest_pending_age);
          else if (field in q) value = q[field];
          else value = q.sizes[field] || 0;
          const target = cell.querySelector("a") || cell;
          target.textContent = String(value);
        }
      }
      for (const [key, value] of Object.entries(sums)) {
        const el = document.getElementById(`sum-${key}`);
        if (el) el.textContent = String(value);
      }
    } catch (err) { /* keep the last numbers; the next tick retries */ }
  }
  if (table) setInterval(refreshQueues, refresh);

  // Limits page: refresh each key's numbers in place.
  const limits = document.getElementById("limits");
  async function refreshLimits() {
    try {
      const data = await getJSON(limits.dataset.source);
      let full = 0, waiting = 0;
      for (const s of data.limits) {
        // The limit in force: an operator's override wins over the tasks' own.
        const o = s.override;
        const concurrency = o && o.concurrency !== null ? o.concurrency : s.concurrency;
        const isFull = concurrency !== null && s.running >= concurrency;
        if (isFull) full += 1;
        waiting += s.waiting;
        const row = Array.from(limits.tBodies[0].rows).find(
          (r) => r.dataset.queue === s.queue && r.dataset.key === s.key);
        if (!row) continue;  // a new key: shown on the next page load
        const cell = (field) => row.querySelector(`[data-field="${field}"]`);
        cell("running").querySelector(".v").textContent = String(s.running);
        let badge = cell("running").querySelector(".badge");
        if (isFull && !badge) {
          badge = document.createElement("span");
          badge.className = "badge warn";
          badge.title = "no room: new tasks of this key wait";
          badge.textContent = "full";
          cell("running").append(" ", badge);
        } else if (!isFull && badge) {
          badge.remove();
        }
        cell("concurrency").textContent = concurrency === null ? "-" : String(concurrency);
        cell("tokens").textContent = s.tokens === null ? "-" : s.tokens.toFixed(1);
        cell("waiting").querySelector("a").textContent = String(s.waiting);
      }
      document.getElementById("sum-full").textContent = String(full);
      document.getElementById("sum-waiting").textContent = String(waiting);
    } catch (err) { /* keep the last numbers; the next tick retries */ }
  }
  if (limits) setInterval(refreshLimits, refresh);

  // Task page: while the task runs, its progress bar, log and state follow the admin API.
  const report = document.getElementById("task-report");
  function logLine(line) {
    const when = line.at ? line.at.slice(11, 19) : "?";
    return `attempt ${line.attempt} ${when} ${line.level} ${line.message}`;
  }
  async function refreshReport() {
    try {
      const task = await getJSON(report.dataset.source);
      const p = task.progress;
      const text = document.getElementById("progress-text");
      if (p) {
        const percent = Math.floor(p.fraction * 100);
        text.textContent = `${percent}%${p.message ? " " + p.message : ""} (attempt ${p.attempt})`;
        document.getElementById("progress-bar").value = p.fraction;
      }
      document.getElementById("task-log").textContent =
        task.logs.map((line) => logLine(line) + "\n").join("");
      const state = document.getElementById("task-state");
      if (state && state.textContent !== task.state) {
        state.textContent = task.state;
        state.className = `badge state-${task.state}`;
      }
      if (task.state !== "active") clearInterval(reportTimer);  // final: nothing moves now
    } catch (err) { /* keep what is shown; the next tick retries */ }
  }
  // Progress is written at most every 0.5 s: poll faster than the page refresh, still gently.
  const reportTimer = report && report.dataset.live === "yes"
    ? setInterval(refreshReport, Math.min(refresh, 2000)) : null;

  // The chart: two polylines (processed, failed) over the last hour, drawn as SVG.
  const chart = document.getElementById("chart");
  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function draw(history) {
    const points = history.points || [];
    chart.replaceChildren();
    if (points.length < 1) {
      const p = document.createElement("p");
      p.className = "muted small";
      p.textContent = "No counts yet.";
      chart.appendChild(p);
      return;
    }
    const W = 800, H = 180, L = 40, B = 20, T = 8;
    const now = points[points.length - 1].t, start = now - history.window;
    const max = Math.max(1, ...points.map((p) => Math.max(p.processed, p.failed)));
    const x = (t) => L + ((t - start) / history.window) * (W - L - 4);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img",
                            "aria-label": "tasks per minute, last hour" });
    svg.appendChild(el("line", { x1: L, y1: H - B, x2: W, y2: H - B, class: "axis" }));
    svg.appendChild(el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    svg.appendChild(el("text", { x: 2, y: T + 10 }, String(Math.round(max * 10) / 10)));
    svg.appendChild(el("text", { x: 2, y: H - B }, "0"));
    svg.appendChild(el("text", { x: L, y: H - 4 }, "-60 min"));
    svg.appendChild(el("text", { x: W - 30, y: H - 4 }, "now"));
    const path = (key) => points.map((p) => `${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
    if (points.length > 1) {
      const first = x(points[0].t).toFixed(1), last = x(now).toFixed(1);
      svg.appendChild(el("polygon", { points: `${first},${H - B} ${path("processed")} ${last},${H - B}`, class: "area-ok" }));
    }
    svg.appendChild(el("polyline", { points: path("processed"), class: "line-ok" }));
    svg.appendChild(el("polyline", { points: path("failed"), class: "line-bad" }));
    const lastPoint = points[points.length - 1];
    svg.appendChild(el("circle", { cx: x(now), cy: y(lastPoint.processed), r: 3, class: "dot-ok" }));
    const title = el("title", {}, `now: ${lastPoint.processed}/min processed, ${lastPoint.failed}/min failed`);
    svg.appendChild(title);
    chart.appendChild(svg);
  }
  async function refreshChart() {
    try {
      const history = await getJSON(chart.dataset.source);
      draw(history);
    } catch (err) { /* next tick */ }
  }
  if (chart) { refreshChart(); setInterval(refreshChart, Math.max(refresh, 10000)); }
})();
