/* Jobs list and job page, live: status badges, progress bars and the log follow the job's events. */
(function () {
  "use strict";
  // As the server renders times (Y-m-d H:i:s in the server's time zone, UTC): the ISO strings it sends.
  function stamp(iso) { return iso ? new Date(iso).toISOString().slice(0, 19).replace("T", " ") : "—"; }
  var detail = document.querySelector("[data-job-detail]");
  TesseraLive.on("job", function (job) {
    if (detail) {
      if (String(job.id) !== detail.dataset.jobDetail) return;
      TesseraJobs.badgeUpdate(detail.querySelector("[data-job-status]"), job);
      TesseraJobs.progressUpdate(detail.querySelector(".progress"), job);
      var log = detail.querySelector("[data-job-log]");
      log.textContent = job.log || "(empty)";
      log.scrollTop = log.scrollHeight;
      detail.querySelector("[data-job-attempts]").textContent = job.attempts;
      detail.querySelector("[data-job-started]").textContent = stamp(job.started);
      detail.querySelector("[data-job-finished]").textContent = stamp(job.finished);
      detail.querySelector("[data-job-state-note]").textContent = job.active ? "Live: this page follows the job as it runs." : "Finished.";
      var error = detail.querySelector("[data-job-error]");
      error.textContent = job.error || "";
      error.hidden = !job.error;
      return;
    }
    var row = document.querySelector('tr[data-job="' + job.id + '"]');
    if (!row) {
      // A job this page has not drawn: say so rather than re-render the table under the reader.
      var notice = document.querySelector("[data-new-jobs]");
      if (notice) { notice.hidden = false; }
      return;
    }
    TesseraJobs.badgeUpdate(row.querySelector(".badge"), job);
    TesseraJobs.progressUpdate(row.querySelector(".progress"), job);
    if (job.finished) row.querySelector("[data-job-finished]").textContent = stamp(job.finished);
  });
})();
