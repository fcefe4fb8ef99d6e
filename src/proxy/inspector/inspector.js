// The inspector page. Every value from the server is put into the page as text
// (textContent, never innerHTML), and the token or credential stays in this script's memory:
// never in the URL, the page or storage.
"use strict";

const state = { headers: {}, user: null, nextUser: null, nextTurn: null };

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function say(message) {
  $("status").textContent = message || "";
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

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
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
  say("");
  try {
    await loadUsers();
  } catch (error) {
    say(error.message);
  }
}

async function loadUsers() {
  const started = performance.now();
  const page = await api("/perpetuity/api/users" + query({ after: state.nextUser, limit: 200 }));
  for (const user of page.users) {
    const item = element("li");
    const button = element("button", "user", user.user);
    button.type = "button";
    button.addEventListener("click", () => showUser(user.user));
    item.append(button, element("span", "meta", " clock " + user.clock + ", " + user.excluded + " excluded"));
    $("user-list").append(item);
  }
  state.nextUser = page.next_after;
  $("more-users").hidden = !page.next_after;
  $("users").hidden = false;
  slow(started);
  if (page.users.length === 1 && !state.nextUser && $("user-list").children.length === 1) {
    await showUser(page.users[0].user);
  }
}

function slow(started) {
  const seconds = (performance.now() - started) / 1000;
  if (seconds > 1) say("that view took " + seconds.toFixed(1) + " s");
}

async function showUser(user) {
  state.user = user;
  state.nextTurn = null;
  $("who").textContent = user;
  $("turns").replaceChildren();
  $("frame").replaceChildren();
  $("memory").hidden = false;
  try {
    await loadTurns();
  } catch (error) {
    say(error.message);
  }
}

async function loadTurns() {
  const started = performance.now();
  const page = await api("/perpetuity/api/turns" + query({ user: state.user, after: state.nextTurn }));
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
    item.append(element("div", "meta", meta), element("div", "text", turn.text));
    $("turns").append(item);
  }
  state.nextTurn = page.next_after;
  $("more-turns").hidden = page.next_after === null || page.next_after === undefined;
  slow(started);
}

async function ask(event) {
  event.preventDefault();
  const started = performance.now();
  const target = $("frame");
  target.replaceChildren();
  try {
    const body = { question: $("question").value };
    if (state.user) body.user = state.user;
    const recalled = await api("/perpetuity/api/frame", {
      method: "POST",
      headers: Object.assign({ "content-type": "application/json" }, state.headers),
      body: JSON.stringify(body),
    });
    const frame = recalled.frame;
    target.append(element("p", "meta",
      frame.tokens + " tokens of a cap of " + frame.cap + "; " + recalled.retrieved.length +
      " rows retrieved; left out by the cap: " + frame.omitted.turns + " turns, " +
      frame.omitted.tokens + " tokens"));
    for (const message of frame.messages) {
      const block = element("div", "message " + message.role);
      block.append(element("div", "meta", message.role + " · " + message.tokens + " tokens · rows " + message.rows.join(", ")),
        element("div", "content", message.content));
      target.append(block);
    }
    slow(started);
  } catch (error) {
    say(error.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", open);
  $("ask").addEventListener("submit", ask);
  $("more-users").addEventListener("click", () => loadUsers().catch((error) => say(error.message)));
  $("more-turns").addEventListener("click", () => loadTurns().catch((error) => say(error.message)));
});
