// AgentTx console: refresh the fragments marked data-refresh="URL" every data-every
// seconds from their own URL (server-rendered HTML). The console's only script: served
// as a static file, because the Content-Security-Policy forbids inline script.
"use strict";
(function () {
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/signin"); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== undefined) { el.innerHTML = html; }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  function start() {
    var els = document.querySelectorAll("[data-refresh]");
    Array.prototype.forEach.call(els, function (el) {
      var every = Math.max(2, parseInt(el.getAttribute("data-every") || "5", 10)) * 1000;
      window.setInterval(function () {
        if (!document.hidden) { refresh(el); }
      }, every);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
