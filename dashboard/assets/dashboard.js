// The live parts of the workerpool dashboard: counts refreshed from
// /api/overview every few seconds, the last-hour charts drawn as SVG, and a
// confirmation before any action. Values go into the page as text nodes
// only (never as markup).
(function () {
  "use strict";

  var POLL_MS = 5000;
  var HOUR_MS = 3600 * 1000;
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#2563eb", "#db2777", "#16a34a", "#ea580c", "#7c3aed", "#0891b2", "#ca8a04", "#64748b"];

  function int(n) {
    return Number(n).toLocaleString("en-US");
  }

  function rate(r) {
    return r === null || r === undefined ? "–" : Number(r).toFixed(1);
  }

  function age(ms) {
    var s = Math.floor(ms / 1000);
    if (s < 1) return Math.floor(ms) + "ms";
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  // An axis label: 45s, 30m, 1h.
  function short(ms) {
    var s = Math.round(ms / 1000);
    if (s < 120) return s + "s";
    if (s < 7200) return Math.round(s / 60) + "m";
    return Math.round(s / 3600) + "h";
  }

  function fields(q) {
    return {
      waiting: int(q.waiting),
      in_flight: int(q.in_flight),
      held_by_lost_workers: int(q.held_by_lost_workers),
      retries_due: int(q.retries_due),
      retries_scheduled: int(q.retries_scheduled),
      scheduled: int(q.scheduled),
      dead: int(q.dead),
      processed_per_second: rate(q.processed_per_second),
      failed_per_second: rate(q.failed_per_second),
      oldest_job_age_seconds:
        q.oldest_job_age_seconds === null ? "–" : age(q.oldest_job_age_seconds * 1000),
      processed_total: int(q.processed_total),
      failed_total: int(q.failed_total),
      workers: q.workers_lost ? q.workers_live + " (+" + q.workers_lost + " lost)" : String(q.workers_live)
    };
  }

  function setText(el, s) {
    if (el.textContent !== s) el.textContent = s;
  }

  function node(name, attrs, parent) {
    var el = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) {
      el.setAttribute(k, attrs[k]);
    });
    if (parent) parent.appendChild(el);
    return el;
  }

  // A y-axis top that reads well: 1, 2, 5 times a power of ten.
  function niceMax(v) {
    if (v <= 0) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) {
      if (steps[i] * p >= v) return steps[i] * p;
    }
    return 10 * p;
  }

  // The lines one chart shows: [{label, points: [[t, y], ...]}].
  function lines(el, data) {
    var kind = el.getAttribute("data-chart");
    var only = el.getAttribute("data-chart-queue");
    var out = [];
    data.history.forEach(function (s) {
      if (only !== null && s.queue !== only) return;
      if (kind === "processed") {
        out.push({ label: s.queue, points: s.points.slice(1).map(function (p) { return [p[0], p[3]]; }) });
      } else if (only !== null) {
        out.push({ label: "waiting", points: s.points.map(function (p) { return [p[0], p[1]]; }) });
        out.push({ label: "in flight", points: s.points.map(function (p) { return [p[0], p[2]]; }) });
      } else {
        out.push({ label: s.queue, points: s.points.map(function (p) { return [p[0], p[1]]; }) });
      }
    });
    return out;
  }

  function draw(el, data) {
    var series = lines(el, data);
    var enough = series.some(function (s) { return s.points.length >= 2; });
    if (!enough) return;
    var W = 640, H = 180, L = 56, R = 8, T = 10, B = 22;
    var now = data.server_time_ms;
    // The last hour, or since the first sample when there is less.
    var from = now;
    var top = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[1] > top) top = p[1];
        if (p[0] < from) from = p[0];
      });
    });
    from = Math.max(from, now - HOUR_MS);
    var span = Math.max(now - from, 1000);
    top = niceMax(top);
    var x = function (t) { return L + ((Math.max(t, from) - from) / span) * (W - L - R); };
    var y = function (v) { return T + (1 - v / top) * (H - T - B); };

    var svg = node("svg", { viewBox: "0 0 " + W + " " + H, width: "100%", role: "img" });
    [0, 0.5, 1].forEach(function (f) {
      var v = top * f;
      node("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e5e7eb", "stroke-width": 1 }, svg);
      var label = node("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#6b7280" }, svg);
      label.textContent = v >= 1000 ? int(Math.round(v)) : String(Math.round(v * 100) / 100);
    });
    [["-" + short(span), from], ["-" + short(span / 2), from + span / 2], ["now", now]].forEach(function (tick, i) {
      var label = node("text", {
        x: x(tick[1]), y: H - 6, "font-size": 11, fill: "#6b7280",
        "text-anchor": i === 0 ? "start" : i === 2 ? "end" : "middle"
      }, svg);
      label.textContent = tick[0];
    });
    series.forEach(function (s, i) {
      if (s.points.length < 2) return;
      var pts = s.points.map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1); });
      node("polyline", {
        points: pts.join(" "), fill: "none", stroke: COLORS[i % COLORS.length],
        "stroke-width": 2, "stroke-linejoin": "round"
      }, svg);
    });

    var legend = document.createElement("ul");
    legend.className = "legend";
    series.forEach(function (s, i) {
      var item = document.createElement("li");
      var swatch = document.createElement("span");
      swatch.className = "swatch c" + (i % COLORS.length);
      item.appendChild(swatch);
      var last = s.points.length ? s.points[s.points.length - 1][1] : 0;
      item.appendChild(document.createTextNode(s.label + " " + (el.getAttribute("data-chart") === "processed" ? rate(last) + "/s" : int(last))));
      legend.appendChild(item);
    });
    el.replaceChildren(svg, legend);
  }

  function update(data) {
    var byName = {};
    data.queues.forEach(function (q) { byName[q.name] = q; });
    document.querySelectorAll("[data-queue]").forEach(function (el) {
      var q = byName[el.getAttribute("data-queue")];
      if (!q) return;
      var f = fields(q);
      el.querySelectorAll("[data-field]").forEach(function (cell) {
        var k = cell.getAttribute("data-field");
        if (Object.prototype.hasOwnProperty.call(f, k)) setText(cell, f[k]);
      });
    });
    document.querySelectorAll("[data-chart]").forEach(function (el) { draw(el, data); });
    var live = document.getElementById("live");
    if (live) {
      live.textContent = "live · updated " + new Date(data.server_time_ms).toLocaleTimeString("en-GB");
      live.className = "live on";
      live.setAttribute("data-live", "1");
    }
  }

  function fail(why) {
    var live = document.getElementById("live");
    if (live) {
      live.textContent = "not live: " + why;
      live.className = "live off";
    }
  }

  function poll() {
    fetch("/api/overview", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(update)
      .catch(function (e) { fail(e.message); })
      .then(function () { setTimeout(poll, POLL_MS); });
  }

  document.addEventListener("submit", function (e) {
    var message = e.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) e.preventDefault();
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", poll);
  } else {
    poll();
  }
})();
