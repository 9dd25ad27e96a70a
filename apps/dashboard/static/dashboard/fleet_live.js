/* The fleet page, live: each GPU instance's utilisation bar and each instance's load, utilisation and
 * p99, from the metrics roll-ups (instance ids "<host>/<runtime key>", as the agents report them); and
 * for each CPU, its runtimes' cores over the last five minutes (vertical scaling resizes them in place),
 * started from the page's history and extended by every metrics message. */
(function () {
  "use strict";
  var fmt = TesseraLive.formatNumber;
  var WINDOW_S = 300;
  var SVG_NS = "http://www.w3.org/2000/svg";

  // One chart per CPU: {el, max, series: {instance id: [[t, cores], ...]}, colours: {instance id: css}}.
  var charts = Array.prototype.map.call(document.querySelectorAll("[data-cores-chart]"), function (el) {
    var data = el.querySelector('script[type="application/json"]');
    var series = data ? JSON.parse(data.textContent) : {};
    var colours = {};
    el.closest("figure").querySelectorAll("li[data-instance]").forEach(function (li) {
      var swatch = li.querySelector(".swatch");
      colours[li.dataset.instance] = swatch ? swatch.style.background : "currentColor";
    });
    return {el: el, max: Number(el.dataset.coresMax) || 1, series: series, colours: colours};
  });

  function draw(chart, now) {
    var svg = chart.el.querySelector("svg");
    var width = 320, height = 90, left = 22, bottom = 14, top = 4;
    var ids = Object.keys(chart.series);
    // The scale: one core above the most any runtime held in the window (at least 2), so that a step from
    // one core to two reads on a 16-core host too (the caption gives the host's cores).
    var highest = 2;
    ids.forEach(function (id) {
      chart.series[id] = chart.series[id].filter(function (p) { return p[0] >= now - WINDOW_S; });
      chart.series[id].forEach(function (p) { highest = Math.max(highest, p[1] + 1); });
    });
    highest = Math.min(highest, Math.max(chart.max, 2));
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    function x(t) { return left + (width - left - 2) * (1 - (now - t) / WINDOW_S); }
    function y(c) { return height - bottom - (height - bottom - top) * c / highest; }
    [0, highest].forEach(function (c) {
      var label = document.createElementNS(SVG_NS, "text");
      label.setAttribute("x", 2); label.setAttribute("y", y(c) + 4); label.setAttribute("class", "axis");
      label.textContent = c;
      svg.appendChild(label);
    });
    var axis = document.createElementNS(SVG_NS, "text");
    axis.setAttribute("x", left); axis.setAttribute("y", height - 2); axis.setAttribute("class", "axis");
    axis.textContent = "-5 min";
    svg.appendChild(axis);
    var drawn = 0;
    ids.forEach(function (id) {
      var points = chart.series[id];
      if (!points.length) return;
      var path = [];
      points.forEach(function (p, i) {  // a step line: cores hold until the next report
        if (i > 0) path.push(x(p[0]).toFixed(1) + "," + y(points[i - 1][1]).toFixed(1));
        path.push(x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1));
      });
      path.push(x(now).toFixed(1) + "," + y(points[points.length - 1][1]).toFixed(1));
      var line = document.createElementNS(SVG_NS, "polyline");
      line.setAttribute("points", path.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", chart.colours[id] || "currentColor");
      line.setAttribute("stroke-width", "2");
      line.setAttribute("data-cores-line", id);
      line.setAttribute("data-cores-now", points[points.length - 1][1]);
      svg.appendChild(line);
      drawn += 1;
    });
    var empty = chart.el.querySelector("[data-cores-empty]");
    if (empty) empty.hidden = drawn > 0;
  }

  charts.forEach(function (chart) { draw(chart, Date.now() / 1000); });

  TesseraLive.on("metrics", function (m) {
    Object.keys(m.reports).forEach(function (host) {
      var seen = document.querySelector('[data-host="' + CSS.escape(host) + '"] .last-seen');
      if (seen) seen.textContent = "last report: " + new Date(m.reports[host] * 1000).toISOString().slice(11, 19) + " UTC";
    });
    document.querySelectorAll("[data-util-bar]").forEach(function (bar) {
      var entry = m.instances[bar.dataset.instance];
      var util = entry && entry.utilization_pct !== null ? Math.max(0, Math.min(100, entry.utilization_pct)) : 0;
      bar.setAttribute("width", (Number(bar.dataset.barWidth) * util / 100).toFixed(1));
    });
    document.querySelectorAll("li[data-instance]").forEach(function (li) {
      var entry = m.instances[li.dataset.instance] || {};
      var util = li.querySelector("[data-util]");
      if (util) util.textContent = fmt(entry.utilization_pct, 0);
      var cores = li.querySelector("[data-cores]");
      if (cores) cores.textContent = entry.cores === undefined || entry.cores === null ? "—" : String(entry.cores);
      li.querySelector("[data-load]").textContent = fmt(entry.load_rps, 1);
      li.querySelector("[data-p99]").textContent = fmt(entry.p99_ms, 1);
      li.classList.toggle("reporting", entry.load_rps !== undefined || entry.utilization_pct !== undefined);
    });
    var now = Date.now() / 1000;
    charts.forEach(function (chart) {
      Object.keys(chart.colours).forEach(function (id) {
        var entry = m.instances[id];
        if (!entry || entry.cores === undefined || entry.cores === null) return;
        (chart.series[id] = chart.series[id] || []).push([now, entry.cores]);
      });
      draw(chart, now);
    });
  });
})();
