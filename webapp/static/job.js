// The live job page. The events stream (the JSON API's, which accepts this browser's session)
// says when the job changed; the status part of the page is then fetched again as HTML, so
// every state is rendered in one place, on the server. Without this script the page reloads
// itself (<noscript> meta refresh) and has a Reload link.
//
// A parent job's list of steps moves more often than the parent: a step that starts or makes
// progress changes nothing of its parent, so the parent's stream does not tell. While the list
// says some steps may still move (data-steps-live="yes"), the status part is also fetched every
// 3 s, less often while nothing changes (a step may wait days for a person's approval), and not
// at all while the tab is hidden.
//
// The part is fetched with the entity tag of what the page shows: unchanged, it is a 304 and
// left alone. A new part replaces the old one, and what a person typed in its forms is
// carried into the same forms of the new part, focus included.
(function () {
  "use strict";
  var region = document.getElementById("job-status");
  if (!region || !window.fetch) {
    return;
  }
  var terminal = ["completed", "failed", "cancelled"];
  var STEPS_POLL_MS = 3000, STEPS_POLL_MAX_MS = 15000;
  var delay = STEPS_POLL_MS;
  var latest = 0;
  var shown = region.dataset.tag;  // the entity tag (quoted, as sent) of the part shown
  var timer = null;

  // A notice that holds only in some states ("Accepted…", "Cancel requested…") goes away
  // once the job has left them, so it never contradicts the state below it.
  function dropStaleNotices() {
    var state = region.querySelector("[data-status]");
    if (!state) { return; }
    var status = state.getAttribute("data-status");
    document.querySelectorAll(".notice[data-while]").forEach(function (notice) {
      if (notice.getAttribute("data-while").split(" ").indexOf(status) < 0) { notice.remove(); }
    });
  }

  function stepsLive() {
    var list = region.querySelector("[data-steps-live]");
    return list !== null && list.getAttribute("data-steps-live") === "yes";
  }

  function schedule() {
    window.clearTimeout(timer);
    timer = stepsLive() && !document.hidden ? window.setTimeout(load, delay) : null;
  }

  // The fields of the part's forms a person types in or chooses, each with a key that names
  // its form and itself, so that a new rendering of the part (the job moved, a step did) can
  // be given what was typed in the old one.
  function eachField(visit) {
    region.querySelectorAll("form").forEach(function (form) {
      Array.prototype.forEach.call(form.elements, function (field) {
        if (field.name && field.type !== "hidden" && field.type !== "submit") {
          visit(form.getAttribute("action") + " " + field.name, field);
        }
      });
    });
  }

  function typedValues() {
    var values = {};
    eachField(function (key, field) {
      values[key] = field.type === "checkbox" ? field.checked : field.value;
    });
    return values;
  }

  function restoreTyped(values, focusedId) {
    eachField(function (key, field) {
      if (!(key in values)) { return; }
      if (field.type === "checkbox") { field.checked = values[key]; } else { field.value = values[key]; }
    });
    var focused = focusedId && document.getElementById(focusedId);
    if (focused && region.contains(focused)) { focused.focus(); }
  }

  function replace(html) {
    var values = typedValues();
    var active = document.activeElement;
    var focusedId = active && region.contains(active) ? active.id : "";
    region.innerHTML = html;
    restoreTyped(values, focusedId);
    dropStaleNotices();
  }

  function load() {
    var mine = ++latest;
    var headers = {"Accept": "text/html"};
    if (shown) { headers["If-None-Match"] = shown; }
    // The tag is ours to send: the browser's cache neither answers nor keeps the part.
    fetch(region.dataset.fragment, {credentials: "same-origin", cache: "no-store", headers: headers})
      .then(function (answer) {
        if (answer.status === 304) { return null; }
        if (!answer.ok) { throw new Error(String(answer.status)); }
        var tag = answer.headers.get("ETag");
        return answer.text().then(function (html) { return {html: html, tag: tag}; });
      })
      .then(function (part) {
        if (mine !== latest) { return; }  // an older answer never overwrites a newer one
        // Unchanged (304), it is left alone: focus and a screen reader's place stay where
        // they are, and the region is not read out again.
        if (part !== null) {
          replace(part.html);
          shown = part.tag;
          delay = STEPS_POLL_MS;
        } else {
          delay = Math.min(delay * 2, STEPS_POLL_MAX_MS);
        }
        // How many answers the page has taken in: what a test waits for.
        region.dataset.loads = String(Number(region.dataset.loads || 0) + 1);
        schedule();
      })
      .catch(function () { window.location.reload(); });
  }

  function follow() {
    var source = new EventSource(region.dataset.events);

    function refresh(event) {
      var job = JSON.parse(event.data);
      delay = STEPS_POLL_MS;  // the job moved: its steps likely did too
      load();
      if (terminal.indexOf(job.status) >= 0) { source.close(); }
    }

    source.addEventListener("status", refresh);
    source.addEventListener("progress", refresh);
    // Our own "error" event carries data: access was lost (signed out, removed). A connection
    // error has none, and the EventSource reconnects by itself with Last-Event-ID.
    // A stream refused outright (429 too_many_streams when the server is serving many, or any
    // answer that is not a stream) closes the EventSource for good: the page then follows the
    // job as it does without JavaScript, reloading itself every 3 s.
    source.addEventListener("error", function (event) {
      if (event.data) { source.close(); window.location.reload(); return; }
      if (source.readyState === EventSource.CLOSED) {
        window.setTimeout(function () { window.location.reload(); }, 3000);
      }
    });
  }

  if (window.EventSource && region.dataset.finished !== "yes") { follow(); }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { window.clearTimeout(timer); timer = null; return; }
    delay = STEPS_POLL_MS;
    if (stepsLive()) { load(); }  // back in view: what it missed, at once
  });
  schedule();
})();
