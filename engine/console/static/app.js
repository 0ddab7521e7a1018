// The console's entry: picks the page from the path (/console, /console/sessions/<id>),
// asks for an API key when the server wants one, and moves between pages without reload.

import { ApiError, key } from "./api.js";
import { showList } from "./list.js";
import { showSession } from "./timeline.js";
import { h } from "./util.js";

const main = document.getElementById("main");
const where = document.getElementById("where");
const conn = document.getElementById("conn");
const forget = document.getElementById("forget");
let leave = () => {};

function go(url) {
  history.pushState(null, "", url);
  route();
}

function setLink(state) {
  conn.textContent = { live: "● live", reconnecting: "○ reconnecting…", refused: "✗ stream refused" }[state] ?? "";
  conn.className = `conn ${state}`;
}

// An API refusal shown where the page was; a 401 asks for a key instead.
function fail(err) {
  leave();
  leave = () => {};
  if (err instanceof ApiError && err.status === 401) {
    askKey(err.message);
    return;
  }
  main.replaceChildren(h("p", { class: "notice bad", id: "error" }, err.message ?? String(err)));
}

function askKey(reason) {
  const input = h("input", { type: "password", id: "key", autocomplete: "off", required: true, size: 40 });
  main.replaceChildren(
    h(
      "form",
      {
        class: "key",
        id: "key-form",
        onsubmit: (e) => {
          e.preventDefault();
          key.set(input.value.trim());
          route();
        },
      },
      h("h1", {}, "API key"),
      h("p", {}, "This server has API keys. Enter one of its SUBS_API_KEYS; it is kept for this browser session only."),
      key.get() ? h("p", { class: "notice bad" }, reason) : "",
      input,
      h("button", { type: "submit" }, "open"),
    ),
  );
  input.focus();
}

function route() {
  leave();
  setLink("");
  forget.hidden = !key.get();
  const path = location.pathname;
  const session = path.match(/^\/console\/sessions\/([^/]+)$/);
  if (session) {
    const sid = decodeURIComponent(session[1]);
    document.title = `${sid} · subs console`;
    where.replaceChildren("/ ", h("span", {}, sid));
    leave = showSession(main, sid, { fail, setLink });
  } else {
    document.title = "sessions · subs console";
    where.replaceChildren("/ sessions");
    leave = showList(main, new URLSearchParams(location.search), go, fail);
  }
}

// Links inside the page move without reload; others behave as links do.
document.addEventListener("click", (e) => {
  const a = e.target.closest("a[href]");
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  if (!a.hasAttribute("data-nav") && !a.classList.contains("brand")) return;
  e.preventDefault();
  go(a.getAttribute("href"));
});
forget.addEventListener("click", () => {
  key.forget();
  route();
});
window.addEventListener("popstate", route);
// A page left for another keeps no stream open (a browser gives a host only a few
// connections); one shown again from the back/forward cache starts over.
window.addEventListener("pagehide", () => {
  leave();
  leave = () => {};
});
window.addEventListener("pageshow", (e) => {
  if (e.persisted) route();
});
route();
