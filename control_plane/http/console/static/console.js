// agentrun console: the live timeline (server-sent events from WatchRun's feed). No inline
// script anywhere: the page's Content-Security-Policy allows only this file.
"use strict";

function fromHtml(html) {
  const t = document.createElement("template");
  t.innerHTML = html.trim();
  return t.content.firstElementChild;
}

function watchTimeline(list) {
  const live = document.getElementById("live");
  const source = new EventSource(list.dataset.events);
  source.addEventListener("open", () => live && live.classList.add("on"));
  source.addEventListener("run", (e) => {
    const summary = document.getElementById("run-summary");
    if (summary) summary.innerHTML = e.data;
  });
  source.addEventListener("step", (e) => {
    const row = fromHtml(e.data);
    if (!row || document.getElementById(row.id)) return; // a reconnect resends nothing twice
    row.classList.add("new");
    list.appendChild(row);
    const decided = row.dataset.resolves;
    const form = decided && document.getElementById("resolve-" + decided);
    if (form) form.remove();
  });
  source.addEventListener("end", () => {
    source.close();
    if (live) { live.classList.remove("on"); live.textContent = "ended"; }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const list = document.getElementById("timeline");
  if (list && list.dataset.events) watchTimeline(list);
});
