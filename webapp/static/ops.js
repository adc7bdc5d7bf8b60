// The operators' pages reload themselves every 5 s to stay current, but never while someone
// uses a form: a focused field, or one changed since the page loaded, holds the reload until
// the form is sent or put back as it was (a half-typed rate limit is not wiped).
(function () {
  "use strict";
  var every = 5000;
  var note = document.getElementById("refresh-note");
  var fields = document.querySelectorAll("main input, main select, main textarea");
  function state(field) {
    if (field.type === "checkbox" || field.type === "radio") return String(field.checked);
    return field.value;
  }
  var loaded = [];
  for (var i = 0; i < fields.length; i++) loaded.push(state(fields[i]));
  function busy() {
    var active = document.activeElement;
    if (active && active.form && active.tagName !== "BUTTON" && active.closest("main")) return true;
    for (var j = 0; j < fields.length; j++) if (state(fields[j]) !== loaded[j]) return true;
    return false;
  }
  // A folded section the operator opened stays open across the reloads.
  var sections = document.querySelectorAll("details[id]");
  for (var k = 0; k < sections.length; k++) {
    var section = sections[k];
    if (window.sessionStorage.getItem("open:" + section.id) === "1") section.open = true;
    section.addEventListener("toggle", function (event) {
      var d = event.target;
      window.sessionStorage.setItem("open:" + d.id, d.open ? "1" : "0");
    });
  }
  function tick() {
    if (busy()) {
      if (note) note.textContent = "refresh paused while you use a form";
      window.setTimeout(tick, 1000);
      return;
    }
    window.location.reload();
  }
  window.setTimeout(tick, every);
})();
