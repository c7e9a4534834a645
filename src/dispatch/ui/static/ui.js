// dispatch's page, made live: on each change the server reports (server-sent events from the store's
// change feed), fetch this same page again and swap its #live region. Without this script the page is
// complete, only not live. No framework, no build step.
(function () {
  "use strict";
  var main = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!main || !window.EventSource || !window.fetch || !window.DOMParser) return;
  var job = main.getAttribute("data-job") || "";
  var timer = null, busy = false, again = false;

  function show(text, on) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
    status.className = "live " + (on ? "on" : "off");
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { cache: "no-store", credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (!fresh) return;
        // Nodes parsed from the server's escaped HTML; a parsed document runs no script.
        main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (n) {
          return document.adoptNode(n);
        }));
        main.setAttribute("data-rendered", fresh.getAttribute("data-rendered") || "");
      })
      .catch(function () { show("reconnecting…", false); })
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  // Coalesce bursts: at most one re-read every half second, however many changes arrive.
  var last = 0;
  function soon() {
    if (timer !== null) return;
    var wait = Math.max(100, last + 500 - Date.now());
    timer = window.setTimeout(function () { timer = null; last = Date.now(); refresh(); }, wait);
  }

  var source = new EventSource("/events" + (job ? "?job=" + encodeURIComponent(job) : ""));
  var dropped = false;
  source.addEventListener("open", function () {
    show("live", true);
    if (dropped) { dropped = false; soon(); }  // what changed while the stream was down
  });
  source.addEventListener("error", function () { dropped = true; show("reconnecting…", false); });
  source.addEventListener("change", function (event) {
    if (!job || event.data === job) soon();
  });
  // Changes may have been missed (the store's feed restarted): read the page again.
  source.addEventListener("resync", soon);
})();
