// toolgate console: live journal rows over Server-Sent Events. Every page
// reads without this script; it only adds rows as calls happen.
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

function startLiveJournal(table) {
  const status = document.getElementById("live-status");
  const body = table.tBodies[0];
  const source = new EventSource(table.dataset.events);
  source.addEventListener("open", () => {
    status.textContent = "Live: new calls appear here as they happen.";
    status.dataset.state = "live";
  });
  source.addEventListener("error", () => {
    status.textContent = "Live updates interrupted; reconnecting…";
    status.dataset.state = "reconnecting";
  });
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
