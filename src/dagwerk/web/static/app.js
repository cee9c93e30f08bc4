// dagwerk dashboard: refreshes the live part of a running run's page and
// submits action forms without leaving the page. Everything works without
// it too (forms post and redirect; pages show the state when loaded).
(function () {
  "use strict";
  var poll = parseInt(document.body.getAttribute("data-poll-ms") || "1000", 10);

  function flash(text, isError) {
    var box = document.getElementById("flash");
    if (!box) { return; }
    box.textContent = text;
    box.className = isError ? "error" : "ok";
    box.hidden = false;
  }

  function busy(live) {
    // Do not replace what someone is typing or ticking.
    var active = document.activeElement;
    if (active && live.contains(active) && (active.tagName === "TEXTAREA" || active.tagName === "INPUT")) {
      return true;
    }
    return live.querySelector("input[type=checkbox]:checked") !== null;
  }

  function refresh(force) {
    var live = document.getElementById("live");
    if (!live) { return Promise.resolve(); }
    if (!force && busy(live)) { return Promise.resolve(); }
    return fetch(live.getAttribute("data-live-url"), { headers: { "Accept": "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(new Error(r.status)); })
      .then(function (html) {
        live.innerHTML = html;
        bind(live);
        loadWhy();
      })
      .catch(function () {});
  }

  function schedule() {
    var live = document.getElementById("live");
    if (!live) { return; }
    window.setTimeout(function () {
      var mark = live.querySelector("[data-run-terminal]");
      var running = mark !== null && mark.getAttribute("data-run-terminal") === "false";
      (running ? refresh(false) : Promise.resolve()).then(schedule);
    }, poll);
  }

  function submit(form, event) {
    event.preventDefault();
    var confirmText = form.getAttribute("data-confirm");
    if (confirmText && !window.confirm(confirmText)) { return; }
    // A button's formAction property is the page's URL when it has no
    // formaction attribute: read the attribute.
    var action = (event.submitter && event.submitter.getAttribute("formaction")) || form.action;
    // URL-encoded like a plain form post (the server reads no multipart).
    var data = new URLSearchParams(new FormData(form));
    fetch(action, { method: "POST", body: data, headers: { "Accept": "application/json" }, credentials: "same-origin" })
      .then(function (r) {
        return r.json().then(function (body) { return { ok: r.ok, status: r.status, body: body }; },
                             function () { return { ok: r.ok, status: r.status, body: {} }; });
      })
      .then(function (answer) {
        if (!answer.ok) {
          var e = answer.body.error || {};
          flash((e.message || "the action failed (HTTP " + answer.status + ")") + (e.field ? " (field: " + e.field + ")" : ""), true);
          return;
        }
        flash("done", false);
        if (document.getElementById("live")) {
          refresh(true);
        } else {
          var row = form.closest("tr");
          if (row && answer.body.attempt_id) { form.outerHTML = '<span class="muted reinjected">re-injected</span>'; }
          else { window.location.reload(); }
        }
      })
      .catch(function (err) { flash("the action failed: " + err, true); });
  }

  function bind(root) {
    var forms = root.querySelectorAll("form[data-action]");
    for (var i = 0; i < forms.length; i++) {
      (function (form) {
        form.addEventListener("submit", function (event) { submit(form, event); });
      })(forms[i]);
    }
  }

  function loadWhy() {
    var panel = document.getElementById("why-panel");
    if (!panel) { return; }
    fetch(panel.getAttribute("data-why-url"), { headers: { "Accept": "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (why) {
        var box = document.getElementById("why");
        box.textContent = "";
        if (why.stall) {
          var p = document.createElement("p");
          p.className = "error";
          p.textContent = "stalled: " + why.stall;
          box.appendChild(p);
        }
        var list = document.createElement("ul");
        (why.nodes || []).forEach(function (n) {
          var item = document.createElement("li");
          item.textContent = n.node + ": " + n.state + " - " + n.reason;
          list.appendChild(item);
        });
        box.appendChild(list);
      })
      .catch(function () {});
  }

  document.addEventListener("DOMContentLoaded", function () {
    bind(document);
    loadWhy();
    schedule();
  });
})();
