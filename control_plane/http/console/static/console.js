// agentrun console: the live timeline (server-sent events from WatchRun's feed), the runs
// list's polling and saved views. No inline
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

// The runs list polls its own rows, counts and pager (GET /console/runs/live with the same
// filters and cursor) and swaps in what changed: no reload, no third-party feed.
const POLL_MS = 2000;

function pollRuns(rows) {
  const live = document.getElementById("runs-live");
  const swap = (id, html) => {
    const el = document.getElementById(id);
    if (el && el.innerHTML !== html) el.innerHTML = html;
  };
  const tick = async () => {
    try {
      const resp = await fetch(rows.dataset.live, { credentials: "same-origin", headers: { Accept: "application/json" } });
      const type = resp.headers.get("content-type") || "";
      if (resp.ok && type.startsWith("application/json")) {
        const fresh = await resp.json();
        swap("run-rows", fresh.rows);
        swap("run-counts", fresh.counts);
        swap("pager", fresh.pager);
        const mark = document.getElementById("runs-live");
        if (mark) mark.classList.add("on");
      } else if (live) {
        live.classList.remove("on");
      }
    } catch (e) {
      const mark = document.getElementById("runs-live");
      if (mark) mark.classList.remove("on");
    }
    setTimeout(tick, POLL_MS);
  };
  setTimeout(tick, POLL_MS);
}

// Saved views: a name for a filtered list, kept in this browser (localStorage).
const VIEWS_KEY = "agentrun.console.views";

function savedViews(box) {
  const list = document.getElementById("views-list");
  const read = () => { try { return JSON.parse(localStorage.getItem(VIEWS_KEY) || "[]"); } catch (e) { return []; } };
  const draw = () => {
    list.textContent = "";
    for (const view of read()) {
      const a = document.createElement("a");
      a.href = "?" + view.query;
      a.textContent = view.name;
      a.className = "view";
      const drop = document.createElement("button");
      drop.type = "button"; drop.className = "link drop"; drop.textContent = "×";
      drop.title = "forget this view";
      drop.addEventListener("click", () => {
        localStorage.setItem(VIEWS_KEY, JSON.stringify(read().filter((v) => v.name !== view.name)));
        draw();
      });
      list.append(a, drop);
    }
  };
  document.getElementById("save-view").addEventListener("click", () => {
    const query = box.dataset.query;
    const name = window.prompt("Name this view", query ? decodeURIComponent(query.replace(/\+/g, " ")) : "all runs");
    if (!name) return;
    localStorage.setItem(VIEWS_KEY, JSON.stringify([...read().filter((v) => v.name !== name), { name, query }]));
    draw();
  });
  draw();
}

document.addEventListener("DOMContentLoaded", () => {
  const list = document.getElementById("timeline");
  if (list && list.dataset.events) watchTimeline(list);
  const rows = document.getElementById("run-rows");
  if (rows && rows.dataset.live) pollRuns(rows);
  const views = document.getElementById("saved-views");
  if (views) savedViews(views);
});
