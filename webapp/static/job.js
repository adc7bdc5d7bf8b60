// The live job page. The events stream (the JSON API's, which accepts this browser's session)
// says when the job changed; the status part of the page is then fetched again as HTML, so
// every state is rendered in one place, on the server. Without this script the page reloads
// itself (<noscript> meta refresh) and has a Reload link.
(function () {
  "use strict";
  var region = document.getElementById("job-status");
  if (!region || !window.EventSource || !window.fetch || region.dataset.finished === "yes") {
    return;
  }
  var terminal = ["completed", "failed", "cancelled"];
  var latest = 0;
  var source = new EventSource(region.dataset.events);

  function refresh(event) {
    var job = JSON.parse(event.data);
    var mine = ++latest;
    fetch(region.dataset.fragment, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (answer) {
        if (!answer.ok) { throw new Error(String(answer.status)); }
        return answer.text();
      })
      .then(function (html) {
        if (mine === latest) { region.innerHTML = html; }  // an older answer never overwrites a newer one
      })
      .catch(function () { window.location.reload(); });
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
})();
