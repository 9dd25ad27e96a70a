/* The overview page: per application sparklines (uPlot) seeded with the server's history and extended by
 * the live metrics roll-ups; fleet totals, running jobs and recent changes updated as events arrive. */
(function () {
  "use strict";
  var history = JSON.parse(document.getElementById("overview-history").textContent);
  var WINDOW_S = 120;
  var fmt = TesseraLive.formatNumber;
  var charts = {};   // application -> {traffic, p99_ms, accuracy, violation_ratio: uPlot}
  var data = {};     // application -> {t: [], demand_rps: [], ...}
  var FIELDS = ["demand_rps", "served_rps", "p99_ms", "accuracy", "violation_ratio"];

  function sparkOptions(el, series, extra) {
    return Object.assign({
      width: Math.max(120, el.clientWidth || 160), height: 42, legend: { show: false }, cursor: { show: false },
      select: { show: false }, axes: [{ show: false }, { show: false }],
      scales: { x: { time: false } }, series: [{}].concat(series),
    }, extra || {});
  }

  function line(stroke, fill, dash) {
    return { stroke: stroke, width: 1.5, fill: fill || undefined, dash: dash || undefined, points: { show: false }, spanGaps: true };
  }

  function chartData(name, kind) {
    var d = data[name];
    if (kind === "traffic") return [d.t, d.demand_rps, d.served_rps];
    if (kind === "p99_ms") {
      var slo = history.slo_ms[name];
      return [d.t, d.p99_ms, d.t.map(function () { return slo; })];
    }
    return [d.t, d[kind]];
  }

  function build(row) {
    var name = row.dataset.application, colour = history.colours[name] || "#2f6fed";
    var series = history.applications[name] || {};
    data[name] = { t: history.t.slice() };
    FIELDS.forEach(function (f) { data[name][f] = (series[f] || []).slice(); });
    charts[name] = {};
    row.querySelectorAll("[data-spark]").forEach(function (el) {
      var kind = el.dataset.spark, opts;
      if (kind === "traffic") opts = sparkOptions(el, [line("#9aa5b1", "rgba(154,165,177,.18)"), line(colour)]);
      else if (kind === "p99_ms") opts = sparkOptions(el, [line(colour), line("#c0392b", null, [4, 3])]);
      else if (kind === "violation_ratio") opts = sparkOptions(el, [line("#c0392b", "rgba(192,57,43,.12)")], { scales: { x: { time: false }, y: { range: [0, 1] } } });
      else opts = sparkOptions(el, [line(colour)], { scales: { x: { time: false }, y: { range: [0, 1] } } });
      charts[name][kind] = new uPlot(opts, chartData(name, kind), el);
    });
  }

  function setText(row, metric, text) {
    var el = row.querySelector('[data-metric="' + metric + '"]');
    if (el) el.textContent = text;
  }

  function update(name, roll, at) {
    var d = data[name];
    var row = document.querySelector('tr[data-application="' + CSS.escape(name) + '"]');
    if (!d || !row) return;
    var second = Math.floor(at);
    if (d.t.length && d.t[d.t.length - 1] === second) {
      FIELDS.forEach(function (f) { d[f][d[f].length - 1] = roll[f]; });
    } else {
      d.t.push(second);
      FIELDS.forEach(function (f) { d[f].push(roll[f]); });
    }
    while (d.t.length && d.t[0] < second - WINDOW_S) {
      d.t.shift();
      FIELDS.forEach(function (f) { d[f].shift(); });
    }
    setText(row, "demand_rps", fmt(roll.demand_rps, 1));
    setText(row, "served_rps", fmt(roll.served_rps, 1));
    setText(row, "p99_ms", fmt(roll.p99_ms, 1));
    setText(row, "accuracy", roll.accuracy === null ? "—" : Number(roll.accuracy).toFixed(3));
    setText(row, "violation_ratio", roll.violation_ratio === null ? "—" : fmt(roll.violation_ratio * 100, 1) + "%");
    var state = row.querySelector("[data-slo-state]");
    state.textContent = roll.slo_met === null ? "no data" : roll.slo_met ? "met" : "missed";
    state.className = "badge slo-state" + (roll.slo_met === null ? "" : roll.slo_met ? " slo-met" : " slo-missed");
    Object.keys(charts[name]).forEach(function (kind) { charts[name][kind].setData(chartData(name, kind)); });
  }

  document.querySelectorAll("tr[data-application]").forEach(build);
  document.querySelectorAll("[data-slo-state]").forEach(function (el) {
    if (el.textContent === "met") el.classList.add("slo-met");
    if (el.textContent === "missed") el.classList.add("slo-missed");
  });

  TesseraLive.on("metrics", function (m) {
    Object.keys(m.applications).forEach(function (name) { update(name, m.applications[name], m.at); });
    document.querySelectorAll("[data-live-total]").forEach(function (el) {
      var value = m.fleet[el.dataset.liveTotal];
      el.textContent = fmt(value, el.dataset.liveTotal === "hosts_reporting" ? 0 : 1);
    });
  });

  // Running jobs: a new active job appears, progress moves, a finished one leaves after a moment.
  var jobsList = document.querySelector("[data-running-jobs]");
  TesseraLive.on("job", function (job) {
    var item = jobsList.querySelector('li[data-job="' + job.id + '"]');
    if (!item && !job.active) return;
    if (!item) {
      item = document.createElement("li");
      item.dataset.job = job.id;
      var link = document.createElement("a");
      link.href = "/jobs/" + job.id + "/";
      link.textContent = job.kind + " #" + job.id;
      item.appendChild(link);
      item.appendChild(document.createTextNode(" "));
      item.appendChild(TesseraJobs.progressBar(job));
      jobsList.appendChild(item);
      var none = jobsList.querySelector("[data-none]");
      if (none) none.remove();
    }
    TesseraJobs.progressUpdate(item.querySelector(".progress"), job);
    if (!job.active) setTimeout(function () { item.remove(); }, 5000);
  });

  // Recent changes: newest on top, as many as the page started with (15).
  var changes = document.querySelector("[data-changes]");
  TesseraLive.on("change", function (c) {
    var none = changes.querySelector("[data-none]");
    if (none) none.remove();
    var li = document.createElement("li");
    var time = document.createElement("time");
    time.className = "muted";
    time.textContent = new Date(c.time).toISOString().slice(11, 19);  // UTC, as the server renders
    var op = document.createElement("span");
    op.className = "op " + (c.action === "create" ? "create" : c.action === "delete" ? "destroy" : "change");
    op.textContent = c.action;
    var what = document.createElement("strong");
    what.textContent = c.object_repr;
    li.append(time, " ", op, " " + c.object_type + " ", what);
    if (c.action === "update" && c.changed_fields && c.changed_fields.length) {
      var fields = document.createElement("span");
      fields.className = "muted";
      fields.textContent = " (" + c.changed_fields.join(", ") + ")";
      li.append(fields);
    }
    var by = document.createElement("span");
    by.className = "muted";
    by.textContent = " by " + c.actor;
    li.append(by);
    changes.prepend(li);
    while (changes.children.length > 15) changes.lastElementChild.remove();
  });

  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (name) {
      Object.keys(charts[name]).forEach(function (kind) {
        var chart = charts[name][kind];
        chart.setSize({ width: Math.max(120, chart.root.parentElement.clientWidth), height: 42 });
      });
    });
  });
})();
