/* Latency-vs-batch charts on the applications page, drawn with the vendored uPlot (global `uPlot`).
 *
 * Each `[data-profile-chart="ID"]` container names a `<script type="application/json" id="ID">` written by
 * Django's json_script: {batch_sizes: [...], slo_ms: number|null, series: [{device_type, device, label,
 * source, source_label, source_detail, latency_ms: [p99 per batch size, null where not measured]}]}.
 * One panel is drawn per device type (GPU model or CPU), one line per slice; the application's p99 SLO is a
 * dashed reference line. Both axes are logarithmic (batch sizes are powers of two; latencies span decades). */
(function () {
  "use strict";

  var HEIGHT = 250;
  var MUTED = "#616e7c", GRID = "#e9edf1", SLO = "#c0392b";
  // Colour by compute size of the slice, so "3g" is the same colour on every GPU model and every variant.
  var BY_COMPUTE = { "1": "#2f6fed", "2": "#2f9e63", "3": "#d97706", "4": "#8e44ad", "7": "#0e7490", full: "#17202a" };
  var SPARE = ["#2f6fed", "#2f9e63", "#d97706", "#8e44ad", "#0e7490", "#b83280", "#5f6b7a", "#17202a"];
  var DASHES = [null, [7, 4], [2, 3], [10, 3, 2, 3]];
  var AXIS_FONT = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  var LABEL_FONT = "600 12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";

  function fmtMs(v) {
    if (v == null) return "—";
    var digits = v >= 100 ? 0 : v >= 10 ? 1 : v >= 1 ? 2 : Math.max(2, 1 - Math.floor(Math.log10(v)));
    return String(parseFloat(v.toFixed(digits)));  // 60 not "60.0", 0.25 not "0.250"
  }

  function colourKey(series) {
    if (series.slice === "full") return "full";
    var m = /^(\d+)g\./i.exec(series.slice || "");
    return m ? m[1] : null;
  }

  // Log-scale ticks labelled at 1, 2 and 5 of each decade (only at powers of ten when the scale spans more
  // than two decades); the others keep their grid line.
  function logValues(u, splits) {
    var scale = u.scales.y, decades = Math.log10(scale.max / scale.min);
    var shown = decades > 2.2 ? [1] : [1, 2, 5];
    return splits.map(function (v) {
      if (v == null || !(v > 0)) return "";
      var m = Math.round(v / Math.pow(10, Math.floor(Math.log10(v) + 1e-9)) * 100) / 100;
      return shown.indexOf(m) >= 0 ? fmtMs(v) : "";
    });
  }

  function groupByDevice(series) {
    var groups = [], byDevice = {};
    series.forEach(function (s) {
      var g = byDevice[s.device_type];
      if (!g) {
        g = byDevice[s.device_type] = { device: s.device, series: [] };
        groups.push(g);
      }
      g.series.push(s);
    });
    return groups;
  }

  function panelHead(group) {
    var head = document.createElement("div");
    head.className = "profile-panel-head";
    var name = document.createElement("span");
    name.className = "profile-device";
    name.textContent = group.device;
    head.appendChild(name);
    var sources = {};
    group.series.forEach(function (s) {
      var entry = sources[s.source] || (sources[s.source] = { label: s.source, details: [s.source_label] });
      if (s.source_detail && entry.details.indexOf(s.source_detail) < 0) entry.details.push(s.source_detail);
    });
    Object.keys(sources).sort().forEach(function (key) {
      var badge = document.createElement("span");
      badge.className = "badge profile-source source-" + key;
      badge.textContent = sources[key].label;
      badge.title = sources[key].details.join("\n");
      head.appendChild(badge);
    });
    return head;
  }

  function drawPanel(panel, readout, group, batchSizes, sloMs, syncKey) {
    // Only the batch sizes this device was measured at; a missing point is a gap, never invented.
    var keep = [];
    batchSizes.forEach(function (b, i) {
      if (group.series.some(function (s) { return s.latency_ms[i] != null; })) keep.push(i);
    });
    var xs = keep.map(function (i) { return batchSizes[i]; });
    var data = [xs];
    var seriesOpts = [{ label: "batch", value: function (u, v) { return v == null ? "" : String(v); } }];
    var used = {};
    group.series.forEach(function (s, n) {
      var key = colourKey(s);
      var stroke = key ? BY_COMPUTE[key] : SPARE[n % SPARE.length];
      var seen = used[stroke] || 0;
      used[stroke] = seen + 1;
      data.push(keep.map(function (i) { return s.latency_ms[i]; }));
      seriesOpts.push({
        label: s.label, stroke: stroke, width: 2, dash: DASHES[seen % DASHES.length] || undefined, spanGaps: true,
        points: { size: 5, fill: stroke },
        value: function (u, v) { return v == null ? "" : fmtMs(v) + " ms"; },
      });
    });
    if (sloMs != null) {
      data.push(xs.map(function () { return sloMs; }));
      seriesOpts.push({
        label: "SLO " + fmtMs(sloMs) + " ms", stroke: SLO, width: 1.5, dash: [6, 4], points: { show: false },
        value: function () { return ""; },
      });
    }
    var width = Math.max(240, Math.floor(panel.clientWidth));
    var opts = {
      width: width, height: HEIGHT,
      scales: {
        x: { time: false, distr: 3, log: 2, range: function (u, min, max) { return min === max ? [min / 2, max * 2] : [min / 1.25, max * 1.25]; } },
        // Padded, then snapped by uPlot's own log range: a log axis whose ends are not on its tick grid makes
        // uPlot's split generator throw "Invalid array length" (0.0159..0.169 ms padded to 0.0099..0.27 did, on
        // one run's measured CPU profiles, and that chart was never drawn).
        y: { distr: 3, log: 10, range: function (u, min, max) { return uPlot.rangeLog(min / 1.6, max * 1.6, 10, false); } },
      },
      axes: [
        { label: "batch size", labelFont: LABEL_FONT, labelSize: 18, labelGap: 0, font: AXIS_FONT, stroke: MUTED, size: 24,
          grid: { stroke: GRID, width: 1 }, ticks: { stroke: GRID, width: 1, size: 4 },
          splits: function () { return xs; }, filter: function (u, splits) { return splits; },
          values: function (u, splits) { return splits.map(function (v) { return v == null ? "" : String(v); }); } },
        { label: "p99 latency (ms)", labelFont: LABEL_FONT, labelSize: 18, labelGap: 0, font: AXIS_FONT, stroke: MUTED, size: 40,
          grid: { stroke: GRID, width: 1 }, ticks: { stroke: GRID, width: 1, size: 4 },
          filter: function (u, splits) { return splits; }, values: logValues },
      ],
      padding: [10, 10, 0, 0],
      series: seriesOpts,
      legend: { live: true },
      cursor: { sync: { key: syncKey }, points: { size: 7 } },
      hooks: {
        // The hovered batch size goes in the panel head; the legend then shows each slice's latency there.
        setCursor: [function (u) {
          var i = u.cursor.idx;
          readout.textContent = i == null ? "" : "batch " + xs[i];
        }],
      },
    };
    return new uPlot(opts, data, panel);
  }

  function drawContainer(container) {
    var source = document.getElementById(container.getAttribute("data-profile-chart"));
    if (!source) return;
    var spec;
    try {
      spec = JSON.parse(source.textContent);
    } catch (e) {
      return;
    }
    var charts = [];
    groupByDevice(spec.series || []).forEach(function (group) {
      var panel = document.createElement("div");
      panel.className = "profile-panel";
      panel.setAttribute("data-device", group.device);
      var head = panelHead(group);
      var readout = document.createElement("span");
      readout.className = "profile-readout";
      head.appendChild(readout);
      panel.appendChild(head);
      var plot = document.createElement("div");
      plot.className = "profile-plot";
      panel.appendChild(plot);
      container.appendChild(panel);
      charts.push({ plot: plot, chart: drawPanel(plot, readout, group, spec.batch_sizes || [], spec.slo_ms, container.getAttribute("data-profile-chart")) });
    });
    if (window.ResizeObserver) {
      var observer = new ResizeObserver(function () {
        charts.forEach(function (c) {
          var w = Math.max(240, Math.floor(c.plot.clientWidth));
          if (w !== c.chart.width) c.chart.setSize({ width: w, height: HEIGHT });
        });
      });
      charts.forEach(function (c) { observer.observe(c.plot); });
    }
  }

  function drawAll() {
    var containers = document.querySelectorAll("[data-profile-chart]");
    if (typeof window.uPlot !== "function") {
      containers.forEach(function (c) {
        c.textContent = "The chart library did not load.";
        c.className += " muted";
      });
      return;
    }
    containers.forEach(drawContainer);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
