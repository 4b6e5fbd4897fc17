// toolgate console: live journal rows and catalog over Server-Sent Events.
// Every page reads without this script; it only adds rows as calls happen and
// redraws the catalog when it changes.
"use strict";

function journalCell(cell) {
  const td = document.createElement("td");
  td.className = cell.class;
  if (cell.link) {
    const a = document.createElement("a");
    a.href = cell.link;
    a.textContent = cell.text;
    td.appendChild(a);
  } else {
    td.textContent = cell.text;
  }
  return td;
}

function journalRow(row) {
  const tr = document.createElement("tr");
  tr.id = row.row_id;
  tr.className = "status-" + row.status + " fresh";
  tr.dataset.status = row.status;
  for (const cell of row.cells) {
    tr.appendChild(journalCell(cell));
  }
  return tr;
}

function catalogRow(row) {
  const tr = document.createElement("tr");
  tr.className = "availability-" + row.availability + " fresh";
  tr.dataset.tool = row.tool;
  for (const cell of row.cells) {
    const td = document.createElement("td");
    td.className = cell.class;
    const inner = document.createElement(cell.class === "tool" ? "code" : "span");
    if (cell.class === "availability") {
      inner.className = "availability";
    }
    inner.textContent = cell.text;
    td.appendChild(inner);
    if (cell.detail) {
      const detail = document.createElement("div");
      detail.className = "reason";
      detail.textContent = cell.detail;
      td.appendChild(detail);
    }
    tr.appendChild(td);
  }
  return tr;
}

function redrawCatalog(data) {
  const table = document.getElementById("catalog");
  if (!table) {
    return;
  }
  const body = document.createElement("tbody");
  for (const row of JSON.parse(data).rows) {
    body.appendChild(catalogRow(row));
  }
  table.replaceChild(body, table.tBodies[0]);
  table.dataset.refreshed = String(Date.now());
}

function startLiveJournal(table) {
  const status = document.getElementById("live-status");
  const body = table.tBodies[0];
  const source = new EventSource(table.dataset.events);
  source.addEventListener("open", () => {
    status.textContent = "Live: new calls appear here as they happen.";
    status.dataset.state = "live";
  });
  source.addEventListener("error", () => {
    // A refused stream (signed out, too many open streams, a restarted
    // server's sign-in page) closes the source for good: say so, rather than
    // promise a reconnect that will not come.
    if (source.readyState === EventSource.CLOSED) {
      status.textContent =
        "Live updates stopped (signed out, too many open streams, or the server restarted); reload the page.";
      status.dataset.state = "stopped";
    } else {
      status.textContent = "Live updates interrupted; reconnecting…";
      status.dataset.state = "reconnecting";
    }
  });
  source.addEventListener("catalog", (event) => redrawCatalog(event.data));
  source.addEventListener("journal", (event) => {
    const row = journalRow(JSON.parse(event.data));
    const existing = document.getElementById(row.id);
    if (existing) {
      existing.replaceWith(row);
    } else {
      body.insertBefore(row, body.firstChild);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("journal");
  if (table && table.dataset.events && window.EventSource) {
    startLiveJournal(table);
  }
});
