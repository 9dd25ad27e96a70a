/* The fleet page, live: each GPU instance's utilisation bar and each instance's load, utilisation and
 * p99, from the metrics roll-ups (instance ids "<host>/<runtime key>", as the agents report them). */
(function () {
  "use strict";
  var fmt = TesseraLive.formatNumber;
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
      li.querySelector("[data-load]").textContent = fmt(entry.load_rps, 1);
      li.querySelector("[data-p99]").textContent = fmt(entry.p99_ms, 1);
      li.classList.toggle("reporting", entry.load_rps !== undefined || entry.utilization_pct !== undefined);
    });
  });
})();
