/* The dashboard's live stream: one WebSocket per page (ws/live/), subscribed to the topics the page draws
 * (<body data-live-topics="metrics jobs changes">). Pages register handlers with TesseraLive.on(type, fn).
 * Reconnects with exponential backoff and jitter; shows the stale banner when the stream is down, when
 * nothing has arrived for STALE_MS, or when the fleet's telemetry has stopped. */
(function () {
  "use strict";
  var STALE_MS = 3000;           // the server sends something at least every second
  var TELEMETRY_STALE_S = 5;     // no agent or router report for this long: say so
  var BACKOFF_MIN_MS = 500, BACKOFF_MAX_MS = 30000;

  var handlers = {};
  var topics = (document.body.dataset.liveTopics || "").split(/\s+/).filter(Boolean);
  var banner = document.getElementById("live-banner");
  var socket = null, backoff = BACKOFF_MIN_MS, lastMessage = 0, reconnectTimer = null, telemetryAge = null, sessionEnded = false;
  var state = { connected: false, messages: 0 };

  function setBanner(text) {
    if (!banner) return;
    banner.hidden = !text;
    banner.querySelector("[data-live-banner-text]").textContent = text || "";
  }

  function judge() {
    if (sessionEnded) {
      setBanner("Your session has ended: log in again for live updates.");
    } else if (!state.connected) {
      setBanner("Live updates are away: reconnecting to the control plane… What you see may be stale.");
    } else if (Date.now() - lastMessage > STALE_MS) {
      setBanner("No live updates for " + Math.round((Date.now() - lastMessage) / 1000) + " s. What you see may be stale.");
    } else if (telemetryAge !== null && telemetryAge > TELEMETRY_STALE_S) {
      setBanner("No telemetry from the fleet for " + Math.round(telemetryAge) + " s: agents or routers are not reporting.");
    } else {
      setBanner("");
    }
    document.body.dataset.liveState = state.connected ? "open" : "closed";
  }

  function dispatch(message) {
    (handlers[message.type] || []).forEach(function (fn) {
      try { fn(message); } catch (err) { console.error("live handler for " + message.type, err); }
    });
    (handlers["*"] || []).forEach(function (fn) { fn(message); });
  }

  function connect() {
    reconnectTimer = null;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/live/");
    socket.onopen = function () {
      state.connected = true;
      backoff = BACKOFF_MIN_MS;
      lastMessage = Date.now();
      if (topics.length) socket.send(JSON.stringify({ subscribe: topics }));
      judge();
      dispatch({ type: "open" });
    };
    socket.onmessage = function (event) {
      lastMessage = Date.now();
      state.messages += 1;
      var message = JSON.parse(event.data);
      if (message.type === "metrics") telemetryAge = message.report_age_s;
      if (message.type === "error") console.warn("live stream:", message.topic || "", message.error);
      dispatch(message);
      judge();
    };
    socket.onclose = function (event) {
      state.connected = false;
      socket = null;
      judge();
      if (event.code === 4401) { sessionEnded = true; judge(); return; }  // no reconnecting: it would be refused again
      var delay = Math.min(BACKOFF_MAX_MS, backoff) * (0.75 + Math.random() * 0.5);
      backoff = Math.min(BACKOFF_MAX_MS, backoff * 2);
      reconnectTimer = setTimeout(connect, delay);
    };
  }

  window.TesseraLive = {
    on: function (type, fn) { (handlers[type] = handlers[type] || []).push(fn); },
    state: state,
    formatNumber: function (value, digits) {
      if (value === null || value === undefined) return "—";
      return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 1 : digits, minimumFractionDigits: digits || 0 });
    },
  };

  // Job progress bars, as templates/dashboard/_progress.html draws them.
  window.TesseraJobs = {
    progressBar: function (job) {
      var bar = document.createElement("div");
      bar.className = "progress";
      bar.setAttribute("role", "progressbar");
      bar.setAttribute("aria-valuemin", "0");
      bar.setAttribute("aria-valuemax", "100");
      bar.innerHTML = '<div class="bar"></div><span class="pct"></span>';
      this.progressUpdate(bar, job);
      return bar;
    },
    progressUpdate: function (bar, job) {
      if (!bar) return;
      bar.className = "progress status-" + job.status;
      bar.setAttribute("aria-valuenow", job.progress);
      bar.dataset.progress = job.progress;
      bar.querySelector(".bar").style.width = job.progress + "%";
      bar.querySelector(".pct").textContent = job.progress + "%";
    },
    badgeUpdate: function (badge, job) {
      if (!badge) return;
      badge.className = "badge status-" + job.status;
      badge.textContent = job.status_display;
      if (badge.dataset.jobStatus !== undefined) badge.dataset.jobStatus = job.status;
    },
  };

  // Connect once every script of the page has registered its handlers.
  document.addEventListener("DOMContentLoaded", function () {
    if (topics.length && "WebSocket" in window) {
      connect();
      setInterval(judge, 1000);
    }
  });
})();
