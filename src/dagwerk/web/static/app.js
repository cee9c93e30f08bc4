// dagwerk dashboard: refreshes the live part of a running run's page,
// appends a running task's new log lines to its page and submits action
// forms without leaving the page. Everything works without
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

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function utc(seconds) {
    // As the server's "time" filter writes it: 2026-01-31 12:00:00.
    return new Date(seconds * 1000).toISOString().slice(0, 19).replace("T", " ");
  }

  function appendLogs(table, lines) {
    var body = table.tBodies[0];
    lines.forEach(function (line) {
      var row = document.createElement("tr");
      row.className = "log level-" + String(line.level).toLowerCase();
      row.setAttribute("data-line", String(line.line_id));
      cell(row, String(line.attempt));
      cell(row, utc(line.at));
      cell(row, line.level);
      cell(row, line.logger);
      var text = cell(row, "");
      var message = document.createElement("span");
      message.className = "message";
      message.textContent = line.message;
      text.appendChild(message);
      if (line.traceback) {
        var pre = document.createElement("pre");
        pre.className = "traceback";
        pre.textContent = line.traceback;
        text.appendChild(pre);
      }
      body.appendChild(row);
    });
    var none = document.getElementById("no-log-lines");
    if (none && body.rows.length) { none.hidden = true; }
  }

  function followLogs() {
    // While the task runs, fetch the lines after the last one shown.
    var table = document.getElementById("log-lines");
    if (!table || table.getAttribute("data-logs-running") !== "true") { return; }
    window.setTimeout(function () {
      var url = table.getAttribute("data-logs-url") + "?after=" +
        encodeURIComponent(table.getAttribute("data-logs-next") || "0");
      fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(new Error(r.status)); })
        .then(function (page) {
          appendLogs(table, page.lines || []);
          table.setAttribute("data-logs-next", String(page.next));
          // A terminal task may still have lines past one answer's limit.
          var more = page.running || (page.lines || []).length > 0;
          table.setAttribute("data-logs-running", more ? "true" : "false");
        })
        .catch(function () {})
        .then(followLogs);
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
    followLogs();
  });
})();
