// Live updates without a reload: every element with data-live is refreshed, every
// data-interval milliseconds, from the HTML its URL answers (rendered and escaped by the
// server). An element with data-since sends what it has: the server then answers 204 when
// nothing changed, only the changed rows and the counts (X-Fleet-Mode: rows), or the whole
// table (full); X-Fleet-Poll is what to send next. A 401 means the session ended: reloading
// shows the login form. Relative times ("in 4m", data-at) are kept current by this script.
(function () {
  "use strict";
  var offset = 0; // the server's clock minus ours, in ms (X-Fleet-Now)
  function mark(text, ok) {
    var status = document.getElementById("live-status");
    if (status) {
      status.textContent = text;
      status.className = ok ? "" : "offline";
    }
  }
  function until(at, now) {
    var seconds = Math.trunc((at - now) / 1000);
    var size = Math.abs(seconds);
    var units = [["d", 86400], ["h", 3600], ["m", 60]];
    var amount = size + "s";
    for (var i = 0; i < units.length; i++) {
      if (size >= units[i][1]) {
        amount = Math.floor(size / units[i][1]) + units[i][0];
        break;
      }
    }
    return seconds >= 0 ? "in " + amount : amount + " ago";
  }
  function relative(node) {
    var now = Date.now() + offset;
    Array.prototype.forEach.call(node.querySelectorAll("[data-at]"), function (span) {
      var at = Date.parse(span.getAttribute("data-at"));
      if (!isNaN(at)) {
        span.textContent = until(at, now);
      }
    });
  }
  function swapRows(node, html) {
    var fresh = document.createElement("template");
    fresh.innerHTML = html;
    var counts = fresh.content.querySelector("#counts");
    var old = node.querySelector("#counts");
    if (counts && old) {
      old.replaceWith(counts);
    }
    Array.prototype.forEach.call(fresh.content.querySelectorAll("tr[data-uid]"), function (row) {
      var uid = row.getAttribute("data-uid");
      var mine = node.querySelector('tr[data-uid="' + CSS.escape(uid) + '"]');
      if (mine) {
        mine.replaceWith(row);
      }
    });
  }
  function follow(node) {
    var base = node.getAttribute("data-live");
    var since = node.getAttribute("data-since");
    var every = parseInt(node.getAttribute("data-interval") || "2000", 10);
    function url() {
      if (since === null) {
        return base;
      }
      return base + (base.indexOf("?") < 0 ? "?" : "&") + "since=" + encodeURIComponent(since);
    }
    function tick() {
      var mode = "full";
      fetch(url(), { credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (response.status === 401) {
            window.location.reload();
            return null;
          }
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          var now = parseInt(response.headers.get("X-Fleet-Now") || "", 10);
          if (!isNaN(now)) {
            offset = now - Date.now();
          }
          mode = response.headers.get("X-Fleet-Mode") || "full";
          if (since !== null && response.headers.get("X-Fleet-Poll")) {
            since = response.headers.get("X-Fleet-Poll");
          }
          return response.status === 204 ? "" : response.text();
        })
        .then(function (html) {
          if (html === null) {
            return;
          }
          if (mode === "rows") {
            swapRows(node, html);
          } else if (mode !== "nothing") {
            node.innerHTML = html;
          }
          relative(node);
          mark("updated " + new Date(Date.now() + offset).toISOString().slice(0, 19).replace("T", " ") + " UTC", true);
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
