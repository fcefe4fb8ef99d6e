// The inspector page. Every value from the server is put into the page as text
// (textContent, never innerHTML), and the token or credential stays in this script's memory:
// never in the URL, the page or storage.
"use strict";

const state = {
  headers: {},
  user: null,
  nextUser: null,
  nextTurn: null,
  nextConversation: null,
  conversation: null,
  request: null,
};

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function button(text, onClick, className) {
  const node = element("button", className, text);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

function say(message) {
  $("status").textContent = message || "";
}

// Run one view's reads; what it returns is said when done. A view that takes more than a second
// says how long it took, and one still loading after half a second says so while it loads.
async function view(label, work) {
  const started = performance.now();
  const pending = setTimeout(() => say("loading " + label + "…"), 500);
  try {
    const done = await work();
    const seconds = (performance.now() - started) / 1000;
    const slow = seconds > 1 ? label + " took " + seconds.toFixed(1) + " s (a large memory: it is read a page at a time)" : "";
    say([done, slow].filter(Boolean).join("; "));
  } catch (error) {
    say(error.message);
  } finally {
    clearTimeout(pending);
  }
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ headers: state.headers, cache: "no-store" }, options));
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (body.error && body.error.message) || response.statusText;
    throw new Error(response.status + ": " + message);
  }
  return body;
}

function post(path, body) {
  return api(path, {
    method: "POST",
    headers: Object.assign({ "content-type": "application/json" }, state.headers),
    body: JSON.stringify(body),
  });
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
}

// The user's key on every call: the operator names it, a credential's own is checked.
function mine(params) {
  return query(Object.assign({ user: state.user }, params || {}));
}

// Ask in the page (never a browser dialog) before a change; resolves to whether it was confirmed.
function confirmInPage(text) {
  return new Promise((resolve) => {
    $("confirm-text").textContent = text;
    $("confirm").hidden = false;
    const done = (answer) => {
      $("confirm").hidden = true;
      $("confirm-yes").onclick = null;
      $("confirm-no").onclick = null;
      resolve(answer);
    };
    $("confirm-yes").onclick = () => done(true);
    $("confirm-no").onclick = () => done(false);
  });
}

async function open(event) {
  event.preventDefault();
  const secret = $("secret").value.trim();
  const narrow = $("narrow").value.trim();
  state.headers = { "x-perpetuity-admin-token": secret, authorization: "Bearer " + secret };
  if (narrow) state.headers["x-perpetuity-user"] = narrow;
  $("secret").value = "";
  $("user-list").replaceChildren();
  state.nextUser = null;
  await view("the users", loadUsers);
}

async function loadUsers() {
  const page = await api("/perpetuity/api/users" + query({ after: state.nextUser, limit: 200 }));
  for (const user of page.users) {
    const item = element("li");
    item.append(button(user.user, () => showUser(user.user), "user"),
      element("span", "meta", " " + user.rows + " rows, clock " + user.clock + ", " + user.excluded + " excluded"));
    $("user-list").append(item);
  }
  state.nextUser = page.next_after;
  $("more-users").hidden = !page.next_after;
  $("users").hidden = false;
  if (page.users.length === 1 && !state.nextUser && $("user-list").children.length === 1) {
    await showUser(page.users[0].user);
  }
}

async function showUser(user) {
  state.user = user;
  state.conversation = null;
  state.request = null;
  $("who").textContent = user;
  for (const id of ["turns", "frame", "found", "request", "requests", "conversations"]) $(id).replaceChildren();
  $("memory").hidden = false;
  await view("the memory", async () => {
    await loadRequests();
    state.nextConversation = null;
    await loadConversations();
    await reloadTurns();
  });
}

async function loadRequests() {
  const page = await api("/perpetuity/api/requests" + mine());
  const list = $("requests");
  list.replaceChildren();
  if (!page.requests.length) list.append(element("li", "meta", "none since the server started"));
  for (const logged of page.requests) {
    const item = element("li", logged.id === state.request ? "picked" : "");
    item.dataset.request = String(logged.id);
    const what = [
      logged.time,
      logged.model,
      "memory " + logged.memory,
      logged.retrieved === null ? null : logged.retrieved + " retrieved",
      logged.frame_tokens === null ? null : logged.frame_tokens + " frame tokens",
    ].filter((part) => part !== null).join(" · ");
    item.append(button("#" + logged.id, () => view("the request", () => showRequest(logged.id))),
      element("span", "meta", " " + what), element("div", "text", logged.question || "(no question)"));
    list.append(item);
  }
}

async function showRequest(id) {
  const logged = await api("/perpetuity/api/request" + mine({ id }));
  state.request = id;
  const target = $("request");
  target.replaceChildren();
  target.append(element("h3", null, "Request #" + logged.id));
  target.append(element("p", "meta", [
    logged.time, logged.format, logged.model, "conversation " + logged.conversation,
    "upstream " + (logged.status === null ? "no answer" : logged.status),
    "captured: " + (logged.question_stored ? "question" : "no question") + ", " +
      (logged.reply_stored ? (logged.reply_complete ? "reply" : "reply (cut short)") : "no reply"),
  ].join(" · ")));
  if (logged.recall) {
    renderRecall(target, logged.recall);
  } else {
    target.append(element("p", "meta", logged.no_recall));
  }
  if (logged.tool_rounds.length) {
    target.append(element("h4", null, "Memory tool calls run mid-stream"));
    for (const round of logged.tool_rounds) {
      const block = element("details", "round");
      block.append(element("summary", null, round.name + " " + round.arguments), element("pre", null, round.result));
      target.append(block);
    }
  }
  const body = element("details", "forwarded");
  body.append(element("summary", null, "The body as forwarded (" + logged.forwarded_bytes + " bytes)"),
    element("pre", "forwarded-body", logged.forwarded));
  target.append(body);
  await loadRequests();
  await reloadTurns();
}

// A recall: budget and spread, the frame's messages, the notice, and the retrieved set with
// each row's score, warmth, reheat and fate.
function renderRecall(target, recall) {
  const frame = recall.frame;
  target.append(element("p", "meta",
    "frame " + frame.tokens + " tokens of a cap of " + recall.budget + " (score spread " +
    Number(recall.spread).toFixed(3) + "), clock " + recall.clock + "; " + recall.retrieved.length +
    " rows retrieved of " + recall.scanned_rows + " scanned, " + recall.offered + " offered; left out by the cap: " +
    frame.omitted.turns + " turns, " + frame.omitted.tokens + " tokens"));
  if (recall.notice) target.append(element("p", "notice", "Notice given: " + recall.notice));
  for (const message of frame.messages) {
    const block = element("div", "message " + message.role);
    block.append(element("div", "meta", message.role + " · " + message.tokens + " tokens · rows " + message.rows.join(", ")),
      element("div", "content", message.content));
    target.append(block);
  }
  const details = element("details", "retrieved");
  details.append(element("summary", null, "Retrieved set, in the frame's order (" + recall.retrieved.length + " rows)"));
  const table = element("table");
  const head = element("tr");
  for (const name of ["rank", "row", "score", "warmth", "reheat", "fate"]) head.append(element("th", null, name));
  table.append(head);
  for (const row of recall.retrieved) {
    const line = element("tr");
    line.append(element("td", null, row.rank), element("td", null, row.row), element("td", null, Number(row.score).toFixed(3)),
      element("td", null, row.warmth === null ? "-" : Number(row.warmth).toFixed(3)),
      element("td", null, row.reheat === null ? "-" : Number(row.reheat).toFixed(3) + (row.raised ? " raised" : "")),
      element("td", "why " + row.why.fate, row.why.reason));
    table.append(line);
  }
  details.append(table);
  target.append(details);
}

async function loadConversations() {
  const page = await api("/perpetuity/api/conversations" + mine({ after: state.nextConversation }));
  for (const conversation of page.conversations) {
    const item = element("li");
    item.dataset.conversation = conversation.conversation;
    item.append(button(conversation.conversation, () => {
      state.conversation = conversation.conversation;
      view("the conversation", reloadTurns);
    }, "conversation"),
    element("span", "meta", " " + conversation.rows + " rows, " + (conversation.first_time || "no time") +
      (conversation.last_time ? " to " + conversation.last_time : "") + " "),
    button("exclude", () => exclude({ conversation: conversation.conversation, excluded: true },
      "Exclude every turn of " + conversation.conversation + " from recall? They stay stored and can be included again.")),
    button("include", () => exclude({ conversation: conversation.conversation, excluded: false },
      "Include every turn of " + conversation.conversation + " in recall again?")));
    $("conversations").append(item);
  }
  state.nextConversation = page.next_after;
  $("more-conversations").hidden = !page.next_after;
}

async function reloadTurns() {
  state.nextTurn = null;
  $("turns").replaceChildren();
  $("turns-of").textContent = (state.conversation ? "of " + state.conversation : "of every conversation") +
    (state.request ? ", against request #" + state.request : "");
  $("all-turns").hidden = !state.conversation;
  await loadTurns();
}

async function loadTurns() {
  const page = await api("/perpetuity/api/turns" + mine({ after: state.nextTurn, conversation: state.conversation, request: state.request }));
  $("clock").textContent = "clock " + page.clock + " tokens";
  for (const turn of page.turns) {
    const item = element("li", "turn" + (turn.excluded ? " excluded" : ""));
    item.dataset.row = String(turn.row);
    const meta = [
      "row " + turn.row,
      turn.conversation,
      turn.role + (turn.speaker ? " (" + turn.speaker + ")" : ""),
      turn.time || "no time",
      "warmth " + Number(turn.warmth).toFixed(3),
      turn.excluded ? "excluded" : "",
    ].filter(Boolean).join(" · ");
    const change = turn.excluded
      ? button("include", () => exclude({ rows: [turn.row], excluded: false }, "Include row " + turn.row + " in recall again?"), "include")
      : button("exclude", () => exclude({ rows: [turn.row], excluded: true }, "Exclude row " + turn.row + " from recall? It stays stored and can be included again."), "exclude");
    item.append(element("div", "meta", meta), element("div", "text", turn.text));
    if (turn.why) item.append(element("div", "why " + turn.why.fate, "request #" + state.request + ": " + turn.why.reason));
    item.append(change);
    $("turns").append(item);
  }
  state.nextTurn = page.next_after;
  $("more-turns").hidden = page.next_after === null || page.next_after === undefined;
}

async function exclude(change, question) {
  if (!(await confirmInPage(question))) return;
  await view("the change", async () => {
    const done = await post("/perpetuity/api/exclusions" + mine(), change);
    await reloadTurns();
    return (change.excluded ? "excluded " : "included ") + done.changed.length + " row(s)";
  });
}

async function ask(event) {
  event.preventDefault();
  const target = $("frame");
  target.replaceChildren();
  await view("the frame", async () => {
    const recall = await post("/perpetuity/api/frame" + mine(), { question: $("question").value });
    target.append(element("h3", null, "The frame this question would get (nothing stored)"));
    renderRecall(target, recall);
  });
}

async function search(event) {
  event.preventDefault();
  const target = $("found");
  target.replaceChildren();
  await view("the search", async () => {
    const found = await post("/perpetuity/api/search" + mine(), { query: $("query").value });
    target.append(element("li", "meta", found.found.length + " best of " + found.scanned_rows + " rows scanned"));
    for (const turn of found.found) {
      const item = element("li", "turn");
      item.append(element("div", "meta", "score " + Number(turn.score).toFixed(3) + " · row " + turn.row + " · " +
        turn.conversation + " · " + turn.role + " · " + (turn.time || "no time")), element("div", "text", turn.text));
      target.append(item);
    }
  });
}

async function purge() {
  const user = state.user;
  if (!(await confirmInPage("Purge every turn of " + user + "? This cannot be undone."))) return;
  await view("the purge", async () => {
    const done = await post("/perpetuity/api/purge" + mine(), { confirm: user });
    await showUser(user);
    return "purged " + done.rows_removed + " rows of " + user;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", open);
  $("ask").addEventListener("submit", ask);
  $("search").addEventListener("submit", search);
  $("purge").addEventListener("click", purge);
  $("refresh-requests").addEventListener("click", () => view("the requests", loadRequests));
  $("all-turns").addEventListener("click", () => {
    state.conversation = null;
    view("the turns", reloadTurns);
  });
  $("more-users").addEventListener("click", () => view("the users", loadUsers));
  $("more-conversations").addEventListener("click", () => view("the conversations", loadConversations));
  $("more-turns").addEventListener("click", () => view("the turns", loadTurns));
});
