// Live updates without a reload: every element with data-live is replaced, every
// data-interval milliseconds, by the HTML fragment its URL answers (rendered and escaped by
// the server). A 401 means the session ended: reloading shows the login form.
(function () {
  "use strict";
  function mark(text, ok) {
    var status = document.getElementById("live-status");
    if (status) {
      status.textContent = text;
      status.className = ok ? "" : "offline";
    }
  }
  function follow(node) {
    var url = node.getAttribute("data-live");
    var every = parseInt(node.getAttribute("data-interval") || "2000", 10);
    function tick() {
      fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (response.status === 401) {
            window.location.reload();
            return null;
          }
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.text();
        })
        .then(function (html) {
          if (html !== null) {
            node.innerHTML = html;
            mark("updated " + new Date().toISOString().slice(0, 19).replace("T", " ") + " UTC", true);
          }
        })
        .catch(function (error) {
          mark("cannot reach discovery (" + error.message + "), retrying", false);
        })
        .finally(function () {
          window.setTimeout(tick, every);
        });
    }
    window.setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), follow);
  });
})();
