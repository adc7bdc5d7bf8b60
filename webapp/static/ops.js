// The operators' pages reload themselves every 5 s to stay current, but never while someone
// uses a form: a focused field, or one changed since the page loaded, holds the reload until
// the form is sent or left as it was (a half-typed rate limit is not wiped).
(function () {
  "use strict";
  var every = 5000;
  var note = document.getElementById("refresh-note");
  function changed(field) {
    if (field.type === "hidden" || field.type === "submit") return false;
    if (field.type === "checkbox" || field.type === "radio") return field.checked !== field.defaultChecked;
    if (field.tagName === "SELECT") {
      for (var i = 0; i < field.options.length; i++) {
        if (field.options[i].selected !== field.options[i].defaultSelected) return true;
      }
      return false;
    }
    return field.value !== field.defaultValue;
  }
  function busy() {
    var active = document.activeElement;
    if (active && active.form && active.tagName !== "BUTTON") return true;
    var fields = document.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) if (changed(fields[i])) return true;
    return false;
  }
  // A folded section the operator opened stays open across the reloads.
  var sections = document.querySelectorAll("details[id]");
  for (var i = 0; i < sections.length; i++) {
    var section = sections[i];
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
