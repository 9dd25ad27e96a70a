/* Plans list and plan page, live: a plan's status change reloads its page (its actions depend on the
 * status, so stale buttons must not stay); other changes, and new plans on the list, are announced. */
(function () {
  "use strict";
  var detail = document.querySelector("[data-plan-detail]");
  var notice = document.querySelector("[data-plans-changed]");
  // The operator's own approve/apply changes the plan too: a reload then would cancel the form's navigation.
  var submitting = false;
  document.addEventListener("submit", function () { submitting = true; });
  TesseraLive.on("change", function (c) {
    if (c.object_type !== "planning.plan") return;
    if (detail) {
      if (c.object_id !== detail.dataset.planDetail) return;
      if (submitting) return;
      if ((c.changed_fields || []).indexOf("status") >= 0) { location.reload(); return; }
    }
    if (notice) notice.hidden = false;
  });
})();
