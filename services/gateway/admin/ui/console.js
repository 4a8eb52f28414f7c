// Switchyard ops console: one ES module, no dependencies, no build step. It reads and changes the gateway only
// through the admin API of the gateway that served it, with the token kept in this tab's sessionStorage (never in a
// cookie; in a URL only as a sign-in link's fragment, `#token=...`, which no browser sends to a server and which the
// page removes from the address bar and the tab's history as it reads it). Everything from the gateway is put in the
// page as text, never as HTML. Every time shown is UTC, ISO 8601 (`2026-12-04 15:35:43Z`), its age in the tooltip.

const TOKEN_KEY = "switchyard.admin-token";
const POLL_MS = 2000;
const PROGRESS_MS = 250;
const LIVE = { minutes: 5, step: 2 };
const FRESH_S = 10; // how far back (gateway seconds) the 5xx rate and latencies shown as "now" may come from
const SWAP_STEPS = ["load", "warmup", "compare", "flip", "drain", "unload"];
const RECENT_MS = 15 * 60 * 1000;
const FILTER_PARAM = "filter";

class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }

  /** The API's error, verbatim, with its status (and the failed step when a swap says it). */
  describe() {
    const status = this.status ? `HTTP ${this.status}` : "no answer";
    const step = this.body && this.body.step ? ` (failed at step '${this.body.step}')` : "";
    return `${status}${step}: ${this.message}`;
  }
}

const state = {
  view: null,
  names: [],
  cards: new Map(),
  timer: null,
  generation: 0,
  dialogs: 0,
  filter: new URLSearchParams(location.search).get(FILTER_PARAM) || "",
  caller: null, // {actor, role} of the token (GET /admin/whoami): a read-only one is offered no action
};

const operator = () => Boolean(state.caller && state.caller.role === "operator");

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(method, path, body, presented = token()) {
  const headers = { Authorization: `Bearer ${presented}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, `the gateway did not answer (${err.message})`, null);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error : text || response.statusText;
    throw new ApiError(response.status, message, data);
  }
  return data;
}

// -- formatting -------------------------------------------------------------------------------------------------

const v = (version) => (version === null || version === undefined ? "–" : `v${version}`);
const pct = (fraction, digits = 1) => (fraction === null || fraction === undefined ? "–" : `${(fraction * 100).toFixed(digits)} %`);
const num = (x, digits = 1) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

function ms(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const value = seconds * 1000;
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(value < 10 ? 1 : 0)} ms`;
}

function utc(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : `${date.toISOString().replace("T", " ").slice(0, 19)}Z`;
}

/** "2 min ago": how old a time is, for the tooltip of the UTC time the page shows. */
function ago(iso, now = Date.now()) {
  const seconds = Math.round((now - new Date(iso).getTime()) / 1000);
  if (Number.isNaN(seconds)) return "";
  if (seconds < 0) return "in the future (is this machine's clock behind the gateway's?)";
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

/** A <time> showing ``iso`` in UTC, its age in the tooltip. */
function when(iso) {
  if (!iso) return "–";
  return h("time", { datetime: iso, title: ago(iso) }, utc(iso));
}

/** The shadow's share in percent; audit events written before the API spoke percent carry the fraction only. */
function shadowPercent(shadow) {
  if (!shadow) return null;
  if (shadow.percent !== undefined && shadow.percent !== null) return shadow.percent;
  return shadow.sample === undefined || shadow.sample === null ? null : shadow.sample * 100;
}

/** A percentage as people write it: "20", "12.5" (never "12.500"). */
const share = (x) => (x === null || x === undefined ? "–" : String(Number(Number(x).toFixed(2))));
const shadowText = (shadow) => (shadow ? `${v(shadow.version)} on ${share(shadowPercent(shadow))} %` : "none");

function steps(timings) {
  return Object.entries(timings || {})
    .filter(([name]) => !name.startsWith("to_"))
    .map(([name, seconds]) => `${name} ${ms(seconds)}`)
    .join(" · ");
}

function comparison(result, lead = "compared") {
  if (!result) return null;
  const diffs = Object.entries(result.max_abs_diff || {}).map(([name, diff]) => `${name}: ${typeof diff === "number" ? diff.toPrecision(3) : diff}`);
  return `${lead} with ${v(result.against)} on the warm-up samples before the flip, largest |difference| per output: ${diffs.join(", ") || "none"}`;
}

function split(canary) {
  if (!canary) return "none";
  if (canary.rolled_back && !canary.weight) return `${v(canary.version)} pulled back`;
  return `${v(canary.version)} at ${share(canary.weight)} %`;
}

// -- sparklines -------------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

/** A line of ``values`` placed by their ``times`` (epoch seconds; the reads are sparser while nobody watches). */
function sparkline(values, label, times = values.map((_, i) => i)) {
  const width = 120;
  const height = 28;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const known = values.filter((x) => x !== null && x !== undefined);
  const top = Math.max(...known, 0);
  svg.setAttribute("aria-label", known.length ? `${label}: ${known.length} points, highest ${num(top, 2)}` : `${label}: no data yet`);
  if (!known.length) return svg;
  const scale = top > 0 ? (height - 4) / top : 0;
  const first = times[0];
  const span = times.length > 1 ? times[times.length - 1] - first : 0;
  let d = "";
  let pen = false;
  values.forEach((value, i) => {
    if (value === null || value === undefined) {
      pen = false;
      return;
    }
    const x = (span > 0 ? ((times[i] - first) / span) * width : width).toFixed(1);
    const y = (height - 2 - value * scale).toFixed(1);
    d += `${pen ? "L" : "M"}${x} ${y} `;
    pen = true;
  });
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", d.trim());
  svg.append(path);
  return svg;
}

// -- views ------------------------------------------------------------------------------------------------------

function show(view) {
  state.view = view;
  $("login").hidden = view !== "login";
  $("models-view").hidden = view !== "models";
  $("events-view").hidden = view !== "events";
  $("nav").hidden = view === "login";
  $("sign-out").hidden = view === "login";
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.id === `nav-${view}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function route() {
  if (linkToken() !== null) return;
  if (!token()) {
    signedOut("");
    return;
  }
  show(location.hash === "#/events" ? "events" : "models");
  restart();
}

function signedOut(message) {
  clearTimeout(state.timer);
  state.generation += 1;
  sessionStorage.removeItem(TOKEN_KEY);
  state.caller = null;
  dropCards(); // built for the previous token's role
  $("caller").textContent = "";
  show("login");
  $("updated").textContent = "";
  $("trouble").textContent = "";
  $("login-error").textContent = message;
  $("token").focus();
}

/** A sign-in link (`switchyard console`): `#token=...`. The token leaves the address bar and the tab's history at
 * once, before anything else runs, and signs in as if typed. The token it read, or null when the URL has none. */
function linkToken() {
  if (!location.hash.startsWith("#token=")) return null;
  const presented = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  history.replaceState(null, "", `${location.pathname}${location.search}#/models`);
  signedOut("");
  signInWith(presented);
  return presented;
}

async function signIn(event) {
  event.preventDefault();
  await signInWith($("token").value.trim(), "Type the admin token first.");
}

/** The same checks for a typed token and a link's: a token, and one the gateway takes. */
async function signInWith(presented, missing = "The sign-in link holds no token: type the admin token.") {
  $("login-error").textContent = "";
  if (!presented) {
    $("login-error").textContent = missing;
    return;
  }
  try {
    await api("GET", "/admin/whoami", undefined, presented);
  } catch (err) {
    const wrong = err.status === 401 || err.status === 403;
    $("login-error").textContent = `${wrong ? "Sign-in refused" : "Sign-in failed"} — ${err.describe()}`;
    $("token").select();
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, presented);
  $("token").value = "";
  if (location.hash !== "#/events") location.hash = "#/models";
  route();
  $("main").focus();
}

function restart() {
  clearTimeout(state.timer);
  state.generation += 1;
  tick(state.generation);
}

// A read that a newer one replaced (an action's end, another view, a sign-out) was started on what is now old: it
// answers nothing, neither cards nor errors, or it would draw the state before the action over the one after it.
const current = (generation) => {
  if (generation !== state.generation) throw new Superseded();
};

class Superseded extends Error {}

async function tick(generation) {
  try {
    if (state.caller === null) {
      const caller = await api("GET", "/admin/whoami");
      current(generation);
      showCaller(caller);
    }
    if (state.view === "models") await refreshModels(generation);
    else if (state.view === "events") await refreshEvents(generation);
    // Not a live region: a screen reader hears the failures (#trouble), not a tick every two seconds.
    $("updated").replaceChildren("Updated ", when(new Date().toISOString()));
    $("trouble").textContent = "";
  } catch (err) {
    if (generation !== state.generation) return;
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      signedOut(`Signed out — ${err.describe()}`);
      return;
    }
    $("trouble").textContent = `Update failed — ${err instanceof ApiError ? err.describe() : err.message}. ` +
      "The models shown are as of the last update; their actions come back with the next one.";
    stale(true);
  }
  if (generation === state.generation) state.timer = setTimeout(() => tick(generation), POLL_MS);
}

/** Who is signed in, beside the sign-out button; the cards are built for the role (no forms or version buttons for
 * a read-only token: the API would refuse them with 403 anyway). */
function showCaller(caller) {
  state.caller = caller;
  dropCards();
  $("caller").textContent = `${caller.actor} (${caller.role})`;
}

/** While the page cannot read the gateway (it restarts, the network is down), what it shows may no longer be true:
 * no button or form acts on it (an Activate or Roll back that the routing no longer warrants) until a read succeeds. */
function stale(on) {
  document.body.classList.toggle("stale", on);
  for (const card of state.cards.values()) {
    for (const control of card.root.querySelectorAll("button, input, select")) control.disabled = on;
  }
}

function dropCards() {
  for (const card of state.cards.values()) card.root.remove();
  state.cards.clear();
}

// -- models -----------------------------------------------------------------------------------------------------

// One read per poll, however many models (GET /admin/console/models: each model's status, live figures and last
// swap): the page is opened when the gateway is in trouble, and a read per model would add to it.
async function refreshModels(generation) {
  const { models } = await api("GET", `/admin/console/models?minutes=${LIVE.minutes}&step=${LIVE.step}`);
  current(generation);
  const names = models.map((model) => model.name);
  state.names = names;
  for (const [name, card] of state.cards) {
    if (!names.includes(name)) {
      card.root.remove();
      state.cards.delete(name);
    }
  }
  stale(false); // read: the render below sets what is disabled by the state itself
  const now = Date.now();
  const rows = models.map((model) => ({ ...model, reasons: attention(model.status, now) }));
  rows.sort((a, b) => rank(a) - rank(b) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const row of rows) {
    let card = state.cards.get(row.name);
    if (!card) {
      card = buildCard(row.name);
      state.cards.set(row.name, card);
    }
    renderCard(card, row.status, row.live, row.last_swap);
    renderReasons(card, row.reasons);
  }
  const container = $("models");
  place(container, rows.length ? rows.map((row) => state.cards.get(row.name).root) : [h("p", { text: "The gateway serves no model." })]);
  applyFilter();
}

// -- what needs attention ---------------------------------------------------------------------------------------

/** Why a model should be looked at first, most pressing first: a version that fails, a canary, a shadow, a version
 * action in the last 15 minutes. Each reason becomes a badge on the model's card. */
function attention(status, now) {
  const routing = status.routing || {};
  const reasons = [];
  const failing = status.loaded
    .filter((row) => row.state === "UNAVAILABLE" || row.problem)
    .map((row) => ({ version: row.version, why: `${row.state}${row.problem ? `: ${row.problem}` : ""}` }));
  // A version whose load or warm-up failed was undone: it is not among the loaded ones, yet it fails all the same.
  for (const [version, why] of Object.entries(status.failed || {})) {
    if (!failing.some((row) => String(row.version) === version)) failing.push({ version: Number(version), why });
  }
  if (failing.length) {
    const detail = failing.map((row) => `${v(row.version)} ${row.why}`).join("; ");
    reasons.push({ key: "failing", rank: 0, text: `failing: ${failing.map((row) => v(row.version)).join(", ")}`, title: detail });
  } else if (status.ready && status.problem) {
    // A model that serves with a problem no version explains: this gateway is behind the routing another one set.
    reasons.push({ key: "behind", rank: 0, text: "replica behind", title: status.problem });
  }
  if (routing.canary) reasons.push({ key: "canary", rank: 1, text: `canary ${split(routing.canary)}` });
  const shadow = (status.traffic && status.traffic.shadow) || routing.shadow;
  if (shadow) reasons.push({ key: "shadow", rank: 2, text: `shadow ${shadowText(shadow)}` });
  const last = status.last_action;
  const age = last ? now - Date.parse(last.finished_at) : NaN;
  if (last && last.result !== "unchanged" && age >= 0 && age < RECENT_MS) {
    const failed = last.result === "failed" ? " failed" : "";
    reasons.push({ key: "recent", rank: 3, text: `${last.action}${failed} ${ago(last.finished_at, now)}`, title: `${last.action} ${last.result} at ${utc(last.finished_at)}` });
  }
  return reasons;
}

/** A model that does not serve comes first of all (its card's "not ready" badge says so); then by its reasons. */
function rank(row) {
  if (!row.status.ready) return -1;
  return Math.min(9, ...row.reasons.map((reason) => reason.rank));
}

function renderReasons(card, reasons) {
  card.reasons.replaceChildren(...reasons.map((reason) => h("li", { class: `reason ${reason.key}`, dataset: { reason: reason.key }, title: reason.title }, reason.text)));
  card.reasons.hidden = !reasons.length;
}

/** Puts ``roots`` in ``container`` in that order, moving only what is out of place: a moved card would drop the
 * keyboard focus, which then goes back to the element with the same id. */
function place(container, roots) {
  const focused = document.activeElement && container.contains(document.activeElement) ? document.activeElement.id : null;
  for (const child of [...container.children]) if (!roots.includes(child)) child.remove();
  let moved = false;
  roots.forEach((root, i) => {
    if (container.children[i] !== root) {
      container.insertBefore(root, container.children[i] || null);
      moved = true;
    }
  });
  if (moved && focused && document.activeElement && document.activeElement.id !== focused) {
    const again = document.getElementById(focused);
    if (again) again.focus();
  }
}

// -- the filter -------------------------------------------------------------------------------------------------

function applyFilter() {
  const wanted = state.filter.trim().toLowerCase();
  let shown = 0;
  for (const [name, card] of state.cards) {
    const match = !wanted || name.toLowerCase().includes(wanted);
    card.root.hidden = !match;
    if (match) shown += 1;
  }
  const total = state.cards.size;
  let text = "";
  if (total && !wanted) text = `${total} models, those that need attention first.`;
  else if (total && shown) text = `${shown} of ${total} models match “${state.filter.trim()}”.`;
  else if (total) text = `No model matches “${state.filter.trim()}” (${total} in all).`;
  if ($("models-count").textContent !== text) $("models-count").textContent = text; // a live region: only changes
}

/** The filter lives in the URL's query (`?filter=mlp`): kept on reload, and a link can carry it. */
function filterChanged() {
  state.filter = $("models-filter").value;
  const url = new URL(location.href);
  if (state.filter) url.searchParams.set(FILTER_PARAM, state.filter);
  else url.searchParams.delete(FILTER_PARAM);
  history.replaceState(history.state, "", url);
  applyFilter();
}

function buildCard(name) {
  const id = `model-${name.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  const part = (title, cls) => {
    const body = h("div", { class: "body" });
    const section = h("section", { class: `part ${cls}`, "aria-label": `${title} of ${name}` }, h("h4", { text: title }), body);
    return { section, body };
  };
  const routing = part("Routing", "routing");
  const live = part("Live figures", "live");
  const versions = part("Versions", "versions");
  const last = part("Last swap", "last");
  const forms = operator() ? buildForms(name, id) : null;
  const badge = h("span", { class: "badge" });
  const reasons = h("ul", { class: "reasons", "aria-label": `Why ${name} needs attention`, hidden: true });
  const root = h(
    "article",
    { class: "model", id, "aria-labelledby": `${id}-title`, dataset: { model: name } },
    h("header", {}, h("h3", { id: `${id}-title`, text: name }), badge, reasons),
    h("div", { class: "grid" }, routing.section, live.section, versions.section, forms ? forms.section : null, last.section),
  );
  return { name, id, root, badge, reasons, routing: routing.body, live: live.body, versions: versions.body, last: last.body, forms };
}

/** A field of the form has the focus, or holds a change not sent yet while the focus is still in the form: then a
 * refresh leaves the form alone. Otherwise it shows the live policy (a draft left behind is dropped). */
function editing(form) {
  const active = document.activeElement;
  return form.dataset.dirty === "true" || Boolean(active && form.contains(active) && active.matches("input, select"));
}

function trackEdits(form) {
  const mark = () => {
    form.dataset.dirty = "true";
  };
  form.addEventListener("input", mark);
  form.addEventListener("change", mark);
  form.addEventListener("focusout", (event) => {
    if (!form.contains(event.relatedTarget)) delete form.dataset.dirty;
  });
  return () => delete form.dataset.dirty; // sent: once the dialog closes, the form shows the live policy
}

function buildForms(name, id) {
  const canaryVersion = h("select", { id: `${id}-canary-version` });
  const weight = h("input", { id: `${id}-canary-weight`, type: "number", min: "0", max: "100", step: "any", placeholder: "0–100", inputmode: "decimal", required: true });
  const shadowVersion = h("select", { id: `${id}-shadow-version` });
  const percent = h("input", { id: `${id}-shadow-percent`, type: "number", min: "0", max: "100", step: "any", placeholder: "0–100", inputmode: "decimal", required: true });
  const rollback = h("button", { type: "button", id: `${id}-rollback`, class: "danger" }, "Roll back");
  rollback.addEventListener("click", () => confirmRollback(name));
  const canary = h(
    "form",
    { class: "row", "aria-label": `Canary of ${name}` },
    h("label", { for: canaryVersion.id }, "Canary version"), canaryVersion,
    h("label", { for: weight.id }, "Weight (%)"), weight,
    h("button", { type: "submit" }, "Set canary"),
    h("button", { type: "button", id: `${id}-canary-clear`, onclick: () => {
      canarySent();
      confirmTraffic(name, null, 0);
    } }, "Clear canary"),
  );
  const canarySent = trackEdits(canary);
  canary.addEventListener("submit", (event) => {
    event.preventDefault();
    canarySent();
    if (canaryVersion.value) confirmTraffic(name, Number(canaryVersion.value), Number(weight.value));
  });
  const shadow = h(
    "form",
    { class: "row", "aria-label": `Shadow of ${name}` },
    h("label", { for: shadowVersion.id }, "Shadow version"), shadowVersion,
    h("label", { for: percent.id }, "Share (%)"), percent,
    h("button", { type: "submit" }, "Set shadow"),
    h("button", { type: "button", id: `${id}-shadow-clear`, onclick: () => {
      shadowSent();
      confirmShadow(name, null, 0);
    } }, "Clear shadow"),
  );
  const shadowSent = trackEdits(shadow);
  shadow.addEventListener("submit", (event) => {
    event.preventDefault();
    shadowSent();
    if (shadowVersion.value) confirmShadow(name, Number(shadowVersion.value), Number(percent.value));
  });
  const section = h(
    "section",
    { class: "part actions", "aria-label": `Traffic actions of ${name}` },
    h("h4", { text: "Traffic" }),
    canary,
    shadow,
    h("div", { class: "row" }, rollback),
  );
  return { section, canary, canaryVersion, weight, shadow, shadowVersion, percent, rollback };
}

/** Replace a part's content, keeping the keyboard focus on the element with the same id. */
function replace(body, ...children) {
  const focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement.id : null;
  body.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined && child !== false));
  if (focused) {
    const again = document.getElementById(focused);
    if (again && !again.disabled) again.focus();
    else focusCard(body.closest("article"));
  }
}

/** The keyboard focus on a model's card, when the control it was on is gone: the next Tab goes on from there. */
function focusCard(root) {
  if (!root || !root.isConnected) return;
  root.tabIndex = -1;
  root.focus();
}

function options(select, versions) {
  const wanted = versions.map(String);
  const have = [...select.options].map((option) => option.value);
  select.disabled = wanted.length === 0;
  if (wanted.join() === have.join()) return;
  const chosen = select.value;
  select.replaceChildren(...wanted.map((value) => h("option", { value }, `version ${value}`)));
  if (wanted.includes(chosen)) select.value = chosen;
}

/** The forms show the live canary and shadow (or an empty share when there is none), unless being edited; a live
 * version that left the disk stays a choice, so that the form can still show it. */
function syncForms(forms, status) {
  const routing = status.routing || {};
  const onDisk = status.available.filter((version) => version !== routing.stable);
  const sync = (form, select, input, policy, amount) => {
    const choices = policy && !onDisk.includes(policy.version) ? [...onDisk, policy.version].sort((a, b) => a - b) : onDisk;
    options(select, choices);
    if (editing(form)) return;
    if (policy) select.value = String(policy.version);
    input.value = policy ? share(amount) : "";
  };
  const canary = routing.canary;
  sync(forms.canary, forms.canaryVersion, forms.weight, canary, canary && canary.weight);
  const shadow = (status.traffic && status.traffic.shadow) || routing.shadow;
  sync(forms.shadow, forms.shadowVersion, forms.percent, shadow, shadowPercent(shadow));
}

/** The model cache's view of a model (SWITCHYARD_MODEL_CACHE_MB): loaded or not, and its memory. */
function memory(cache) {
  const mb = `${cache.memory_mb.toFixed(1)} MiB${cache.memory_is ? ` (${cache.memory_is})` : ""}`;
  if (cache.resident) return `loaded, ${mb}${cache.pinned ? ", pinned" : ""}`;
  const why = { capacity: "unloaded to make room", idle: "unloaded as idle" }[cache.unloaded_by] || "not loaded";
  return cache.memory_is ? `${why} (loads on its next request; last ${mb})` : `${why} (loads on its next request)`;
}

/** `live`: null while no version of the model is routed (it has no series); `lastSwap`: its newest activate or
 * rollback in the audit log, or null. */
function renderCard(card, status, live, lastSwap) {
  const routing = status.routing || {};
  const traffic = status.traffic || {};
  const canary = routing.canary;
  const shadow = routing.shadow;
  card.badge.textContent = status.ready ? "ready" : "not ready";
  card.badge.className = `badge ${status.ready ? "ok" : "bad"}`;

  const field = (label, key, value) => [h("dt", { text: label }), h("dd", { dataset: { field: key } }, value)];
  replace(
    card.routing,
    h(
      "dl",
      {},
      field("Stable", "stable", v(routing.stable)),
      field("Previous", "previous", v(routing.previous)),
      field("Canary", "canary", split(canary)),
      field("Shadow", "shadow", shadowText(traffic.shadow || shadow)),
      field("Generation", "generation", routing.generation ?? "–"),
      field("Changed", "updated", when(routing.updated_at)),
      status.cache ? field("Memory", "memory", memory(status.cache)) : null,
    ),
    status.problem ? h("p", { class: "error", text: status.problem }) : null,
    canary && canary.rolled_back ? h("p", { class: "error", text: `Canary pulled back: ${canary.rolled_back}` }) : null,
    status.action ? running(status.action) : null,
  );

  replace(card.live, live ? liveTable(card, live, traffic) : h("p", { class: "note", text: "No figures: no version of it is routed yet." }));
  replace(card.versions, versionsTable(card, status));

  if (card.forms) {
    syncForms(card.forms, status);
    card.forms.rollback.disabled = routing.previous === null || routing.previous === undefined;
    card.forms.rollback.textContent = card.forms.rollback.disabled ? "Roll back (no previous version)" : `Roll back to ${v(routing.previous)}`;
  }

  card.status = status;
  replace(card.last, swapSummary(lastSwap), replayLine(status.last_replay));
}

/** The last replay check of an activation (``--verify-replay``): its verdict and what it compared. */
function replayLine(report) {
  if (!report) return null;
  const diffs = Object.entries(report.outputs || {}).map(([name, figures]) => `${name} ${typeof figures.max_abs_diff === "number" ? figures.max_abs_diff.toPrecision(3) : figures.max_abs_diff}`);
  const verdict = report.passed ? "passed" : "refused";
  const text = `Replay check of ${v(report.version)} ${when(report.checked_at)}: ${verdict}; ${report.compared} of ${report.records} logged requests compared, ${report.differing} differing, ${report.status_mismatches} status mismatches${diffs.length ? `; largest |difference|: ${diffs.join(", ")}` : ""}`;
  return h("p", { class: report.passed ? "note" : "error", dataset: { field: "replay" }, title: report.source, text });
}

function running(action) {
  const done = Object.entries(action.steps || {}).filter(([name]) => !name.startsWith("to_"));
  return h(
    "p",
    { class: "running", role: "status" },
    `${action.action} of ${v(action.version)} running: step '${action.step}'`,
    done.length ? ` (done: ${done.map(([name, s]) => `${name} ${ms(s)}`).join(", ")})` : "",
  );
}

// Where a version's instances run, when any is on a GPU or was meant to be ("cuda:0 ×2, cuda:1 ×2").
function placed(devices) {
  if (!devices || (!devices.gpu_fallback && devices.instances.every((d) => d === "cpu"))) return null;
  const counts = new Map();
  for (const device of devices.instances) counts.set(device, (counts.get(device) || 0) + 1);
  const text = [...counts].map(([device, n]) => (n > 1 ? `${device} ×${n}` : device)).join(", ");
  return h("span", { class: "devices", text: devices.gpu_fallback ? ` on ${text} (GPU fallback)` : ` on ${text}` });
}

// A loaded version's problem, or why a version on disk is not loaded (its load or warm-up failed and was undone).
function problemOf(row, failed) {
  const problem = row ? row.problem : failed;
  return problem ? h("span", { class: "error" }, ` — ${problem}`) : null;
}

function versionsTable(card, status) {
  const routing = status.routing || {};
  const loaded = new Map(status.loaded.map((row) => [row.version, row]));
  const all = [...new Set([...status.available, ...loaded.keys()])].sort((a, b) => a - b);
  const rows = all.map((version) => {
    const row = loaded.get(version);
    const roles = [];
    if (version === routing.stable) roles.push("stable");
    if (version === routing.previous) roles.push("previous");
    if (routing.canary && version === routing.canary.version) roles.push(`canary ${share(routing.canary.weight)} %`);
    if (routing.shadow && version === routing.shadow.version) roles.push("shadow");
    // Not released by its export: a start with no routing state never makes it stable, an activation does.
    if ((status.unreleased || []).includes(version) && version !== routing.stable) roles.push("not released");
    const onDisk = status.available.includes(version);
    const act = (verb, handler) =>
      h("button", { type: "button", id: `${card.id}-${verb.toLowerCase()}-${version}`, "aria-label": `${verb} version ${version} of ${card.name}`, onclick: handler }, verb);
    const buttons = [];
    if (operator()) { // a read-only token is offered no action
      if (onDisk && version !== routing.stable) buttons.push(act("Activate", () => confirmActivate(card.name, version, routing.stable)));
      if (onDisk && !row) buttons.push(act("Load", () => confirmLoad(card.name, version, "load")));
      if (row && version !== routing.stable) buttons.push(act("Unload", () => confirmLoad(card.name, version, "unload")));
    }
    return h(
      "tr",
      { dataset: { version: String(version) } },
      h("th", { scope: "row", text: v(version) }),
      h("td", { dataset: { field: "state" } }, row ? row.state : "on disk, not loaded", row ? placed(row.devices) : null, problemOf(row, (status.failed || {})[version])),
      h("td", { dataset: { field: "leases" }, text: row ? String(row.leases) : "–" }),
      h("td", { class: "optional", text: onDisk ? "yes" : "no" }),
      h("td", { dataset: { field: "role" }, text: roles.join(", ") || "–" }),
      h("td", { class: "buttons" }, buttons),
    );
  });
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      {},
      h("caption", { text: `Versions of ${card.name}: loaded ones with their state and in-flight requests, and those on disk` }),
      h("thead", {}, h("tr", {}, ["Version", "State", "In flight", "On disk", "Role", "Actions"].map((text) => h("th", { scope: "col", class: text === "On disk" ? "optional" : null, text })))),
      h("tbody", {}, rows),
    ),
  );
}

const FIGURES = [
  { key: "rps", label: "Requests/s", show: (x) => num(x, 1) },
  { key: "error_rate", label: "5xx rate", show: (x) => pct(x, 2) },
  { key: "p50_ms", label: "p50 latency", show: (x) => (x === null || x === undefined ? "–" : `${num(x, 1)} ms`) },
  { key: "p99_ms", label: "p99 latency", show: (x) => (x === null || x === undefined ? "–" : `${num(x, 1)} ms`) },
];

function liveTable(card, live, traffic) {
  const sides = [{ side: "stable", version: live.stable, title: `Stable ${v(live.stable)}` }];
  if (live.canary) sides.push({ side: "canary", version: live.canary.version, title: `Canary ${v(live.canary.version)} (${share(live.canary.weight)} %)` });
  const points = (version) => {
    const series = live.versions.find((item) => item.version === version);
    return series ? series.points : [];
  };
  // A rate or latency is the newest one of the last FRESH_S of the series (a step with no request has none): an older
  // one shown beside "0.0 requests/s" would pass a figure from minutes ago for the model's state now.
  const latest = (series, key) => {
    const newest = series.length ? series[series.length - 1].t : 0;
    for (let i = series.length - 1; i >= 0 && series[i].t >= newest - FRESH_S; i -= 1) {
      const value = series[i][key];
      if (value !== null && value !== undefined) return value;
    }
    return null;
  };
  // A version with no series has not been asked anything since the gateway started: once the gateway has read its
  // counters twice (the shadow's list has a point per step, whatever was served), its rate is a known 0, not "–".
  const idle = live.shadow.length ? 0 : null;
  const rows = FIGURES.map((figure) =>
    h(
      "tr",
      {},
      h("th", { scope: "row", text: figure.label }),
      sides.map(({ side, version }) => {
        const series = points(version);
        const values = series.map((point) => point[figure.key]);
        const value = figure.key === "rps" ? (values.length ? values[values.length - 1] : idle) : latest(series, figure.key);
        return h(
          "td",
          { dataset: { figure: `${side}-${figure.key}` } },
          h("span", { class: "value", text: figure.show(value) }),
          sparkline(values, `${figure.label} of ${v(version)}, last ${live.minutes} minutes`, series.map((point) => point.t)),
        );
      }),
    ),
  );
  const parts = [
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        { class: "figures" },
        h("caption", { text: `Last ${live.minutes} minutes, a point every ${live.step_s} s (unversioned and pinned requests)` }),
        h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Figure" }), sides.map(({ title }) => h("th", { scope: "col", text: title })))),
        h("tbody", {}, rows),
      ),
    ),
  ];
  const window = traffic.canary && traffic.canary.window;
  if (window) {
    const side = (name) => {
      const f = window[name] || {};
      return `${name} ${f.requests ?? 0} requests, ${pct(f.error_rate ?? 0, 1)} 5xx, p99 ${f.p99_ms === null || f.p99_ms === undefined ? "–" : `${num(f.p99_ms, 1)} ms`}`;
    };
    parts.push(h("p", { class: "note", dataset: { field: "canary-window" } }, `Rollback window (last ${window.seconds} s, as the gateway judges the canary): ${side("stable")}; ${side("canary")}.`));
  }
  if (live.shadow_policy) parts.push(shadowFigures(live));
  return parts;
}

function shadowFigures(live) {
  const recent = live.shadow.slice(-30);
  const compared = recent.reduce((sum, point) => sum + point.compared, 0);
  const notCompared = recent.reduce((sum, point) => sum + point.not_compared, 0);
  const flips = recent.reduce((sum, point) => sum + point.argmax_disagreements, 0);
  const edges = recent.map((point) => point.divergence_max_le).filter((x) => x !== null && x !== undefined);
  const worst = edges.length ? Math.max(...edges) : null;
  const seconds = recent.length * live.step_s;
  return h(
    "p",
    { class: "note shadow", dataset: { field: "shadow-figures" } },
    `Shadow ${v(live.shadow_policy.version)} over the last ${seconds} s: ${compared} answers compared` +
      (notCompared ? `, ${notCompared} not compared (dropped, failed or unavailable)` : "") +
      `, largest divergence ${worst === null ? "–" : `≤ ${worst}`}, argmax disagreements ${flips} `,
    sparkline(live.shadow.map((point) => point.rps), `Shadow comparisons per second, last ${live.minutes} minutes`, live.shadow.map((point) => point.t)),
  );
}

function swapSummary(event) {
  if (!event) return h("p", { class: "note", text: "No activate or rollback in the audit log yet." });
  const timings = Object.entries(event.steps || {}).filter(([name]) => !name.startsWith("to_"));
  const longest = Math.max(...timings.map(([, s]) => s), 1e-9);
  const bars = h(
    "ul",
    { class: "bars", "aria-label": "Step timings" },
    timings.map(([name, seconds]) => {
      const bar = h("span", { class: "bar" });
      bar.style.width = `${Math.max(2, (seconds / longest) * 100)}%`;
      return h("li", {}, h("span", { class: "step", text: name }), h("span", { class: "track" }, bar), h("span", { class: "seconds", text: ms(seconds) }));
    }),
  );
  const versions = event.versions || {};
  const flip = event.steps && event.steps.to_flip !== undefined ? `, to flip ${ms(event.steps.to_flip)}` : "";
  const drained = event.steps && event.steps.to_drained !== undefined ? `, to drained ${ms(event.steps.to_drained)}` : "";
  return [
    h("p", {}, `${event.action} ${v(versions.from)} → ${v(versions.to)}: `, h("strong", { class: `result ${event.result}`, text: event.result }), " at ", when(event.time), `${flip}${drained}`),
    bars,
    event.error ? h("p", { class: "error", text: event.error }) : null,
    event.detail && event.detail.comparison ? h("p", { class: "note", text: comparison(event.detail.comparison) }) : null,
  ];
}

// -- actions ----------------------------------------------------------------------------------------------------

function confirmActivate(model, version, stable) {
  const compare = h("input", { type: "checkbox", id: "opt-compare", checked: true });
  const keep = h("input", { type: "checkbox", id: "opt-keep", checked: true });
  const card = state.cards.get(model);
  const loaded = card && card.status ? card.status.loaded.some((row) => row.version === version && row.state === "READY") : false;
  const preview = loaded
    ? async () => {
        const answer = await api("POST", `/admin/models/${enc(model)}/versions/${version}/compare`);
        return comparison(answer.comparison, "Preview: the same requests on both versions, compared");
      }
    : async () => `Version ${version} is not loaded: the swap loads it, warms it up and compares it with ${v(stable)} before the flip (the result shows here).`;
  confirmAction({
    preview,
    model,
    title: `Activate version ${version} of ${model}?`,
    body: [
      `Version ${version} is loaded beside ${v(stable)} (unless it is loaded already) and warmed up; then the routing of unversioned requests flips to it atomically. `,
      `Requests in flight on ${v(stable)} finish there (drain). Any failure before the flip leaves ${v(stable)} serving.`,
    ],
    options: [
      h("label", { class: "check" }, compare, ` Compare its outputs with ${v(stable)}'s before the flip`),
      h("label", { class: "check" }, keep, ` Keep ${v(stable)} loaded as the previous version (instant rollback)`),
    ],
    steps: SWAP_STEPS,
    call: () => api("POST", `/admin/models/${enc(model)}/versions/${version}/activate`, { compare: compare.checked, keep_previous: keep.checked }),
  });
}

function confirmRollback(model) {
  const card = state.cards.get(model);
  const previous = card && card.forms ? card.forms.rollback.textContent.replace("Roll back to ", "") : "the previous version";
  confirmAction({
    model,
    title: `Roll back ${model}?`,
    body: [`Unversioned requests go back to ${previous} (the previous stable version), with the same swap protocol: load if needed, warm up, flip, drain.`],
    steps: SWAP_STEPS,
    call: () => api("POST", `/admin/models/${enc(model)}/rollback`, {}),
  });
}

function confirmTraffic(model, version, weight) {
  const clearing = version === null || !weight;
  confirmAction({
    model,
    title: clearing ? `Clear the canary of ${model}?` : `Send ${weight} % of ${model}'s traffic to version ${version}?`,
    body: [
      clearing
        ? "All unversioned requests go to the stable version again; the canary version stays loaded."
        : `Version ${version} is loaded and warmed up if it is not, then ${weight} % of unversioned requests go to it. The stable version keeps the rest.`,
    ],
    steps: ["load", "warmup", "flip"],
    call: () => api("PUT", `/admin/models/${enc(model)}/traffic`, clearing ? { canary: null } : { canary: version, weight }),
  });
}

function confirmShadow(model, version, percent) {
  const clearing = version === null || !percent;
  confirmAction({
    model,
    title: clearing ? `Stop shadowing ${model}?` : `Shadow ${percent} % of ${model}'s requests on version ${version}?`,
    body: [
      clearing
        ? "No request is copied to the shadow version any more; it stays loaded."
        : `A ${percent} % sample of unversioned requests also runs on version ${version}; its answers are compared with the served ones and dropped, never sent.`,
    ],
    steps: ["load", "warmup", "flip"],
    call: () => api("PUT", `/admin/models/${enc(model)}/shadow`, clearing ? { version: null } : { version, percent }),
  });
}

function confirmLoad(model, version, verb) {
  confirmAction({
    model,
    title: `${verb === "load" ? "Load" : "Unload"} version ${version} of ${model}?`,
    body: [
      verb === "load"
        ? `Version ${version} is loaded and warmed up; the routing does not change (requests pinned to /versions/${version} can reach it).`
        : `Requests in flight on version ${version} finish first; then it is unloaded. The gateway refuses to unload the stable version.`,
    ],
    steps: verb === "load" ? ["load", "warmup"] : ["drain", "unload"],
    call: () => api("POST", `/admin/models/${enc(model)}/versions/${version}/${verb}`, {}),
  });
}

function renderSteps(names, progress, finished) {
  const done = (progress && progress.steps) || {};
  const list = [...new Set([...names, ...Object.keys(done).filter((name) => !name.startsWith("to_"))])];
  $("confirm-steps").replaceChildren(
    ...list.map((name) => {
      let mark = "pending";
      if (done[name] !== undefined) mark = "done";
      else if (progress && progress.step === name && !finished) mark = "running";
      else if (finished) mark = "skipped";
      const text = mark === "done" ? `${name}: ${ms(done[name])}` : `${name}: ${mark}`;
      return h("li", { class: mark, dataset: { step: name } }, text);
    }),
  );
}

function confirmAction({ model, title, body, options = [], steps: names, call, preview = null }) {
  const dialog = $("confirm");
  const ok = $("confirm-ok");
  const cancel = $("confirm-cancel");
  $("confirm-title").textContent = title;
  $("confirm-body").replaceChildren(...body.map((text) => h("p", { text })));
  $("confirm-options").replaceChildren(...options);
  $("confirm-steps").replaceChildren();
  $("confirm-progress").textContent = "";
  $("confirm-result").replaceChildren();
  $("confirm-preview").textContent = "";
  const opened = (state.dialogs += 1);
  ok.hidden = false;
  ok.disabled = false;
  if (preview) {
    // Confirm waits for the preview: the comparison holds the model's action lock while it runs.
    ok.disabled = true;
    $("confirm-preview").textContent = "Comparing the outputs before you confirm…";
    const settle = (text) => {
      if (opened !== state.dialogs) return;
      $("confirm-preview").textContent = text;
      ok.disabled = false;
    };
    preview().then(settle, (err) => settle(`No preview — ${err instanceof ApiError ? err.describe() : err.message}`));
  }
  cancel.disabled = false;
  cancel.textContent = "Cancel";
  const opener = document.activeElement;
  const openerId = opener ? opener.id : "";
  let running = false;

  ok.onclick = async () => {
    running = true;
    ok.disabled = true;
    cancel.disabled = true;
    for (const input of $("confirm-options").querySelectorAll("input")) input.disabled = true;
    $("confirm-progress").textContent = "Working…";
    renderSteps(names, null, false);
    let watching = true;
    const watch = async () => {
      while (watching) {
        try {
          const status = await api("GET", `/admin/models/${enc(model)}`);
          if (watching && status.action) {
            renderSteps(names, status.action, false);
            $("confirm-progress").textContent = `Step '${status.action.step}'…`;
          }
        } catch {
          // the action's own answer says what went wrong
        }
        await new Promise((resolve) => setTimeout(resolve, PROGRESS_MS));
      }
    };
    watch();
    try {
      const report = await call();
      watching = false;
      renderSteps(names, { steps: report.steps }, true);
      $("confirm-progress").textContent = `Done: ${report.result}`;
      $("confirm-result").replaceChildren(...reportLines(report));
    } catch (err) {
      watching = false;
      $("confirm-progress").textContent = "Failed";
      const message = err instanceof ApiError ? err.describe() : err.message;
      $("confirm-result").replaceChildren(h("p", { class: "error", role: "alert", dataset: { field: "api-error" } }, message));
    }
    running = false;
    ok.hidden = true;
    cancel.disabled = false;
    cancel.textContent = "Close";
    cancel.focus();
    restart();
  };
  cancel.onclick = () => dialog.close();
  dialog.oncancel = (event) => {
    if (running) event.preventDefault(); // Escape does not hide an action that is still running
  };
  dialog.onclose = () => {
    // The opener may have been re-rendered by a refresh since: the same id finds its successor.
    const again = (openerId && document.getElementById(openerId)) || opener;
    if (again && again.isConnected && !again.disabled) {
      again.focus();
      return;
    }
    // The action took its button away (an activated version has none; a rollback leaves none to roll back to): the
    // keyboard goes on from the model's card, not from the top of the page.
    const card = state.cards.get(model);
    if (card) focusCard(card.root);
  };
  dialog.showModal();
  cancel.focus();
}

function reportLines(report) {
  const versions = report.versions || {};
  const lines = [h("p", { dataset: { field: "result" } }, h("strong", { class: `result ${report.result}`, text: report.result }), ` — ${report.action} of ${report.model}`)];
  if ("from" in versions || "to" in versions) lines.push(h("p", { text: `Routing: ${v(versions.from)} → ${v(versions.to)}` }));
  if (report.routing) {
    const routing = report.routing;
    lines.push(h("p", { text: `Now: stable ${v(routing.stable)}, previous ${v(routing.previous)}, canary ${split(routing.canary)}, shadow ${shadowText(routing.shadow)} (generation ${routing.generation})` }));
  }
  if (report.comparison) lines.push(h("p", { dataset: { field: "comparison" }, text: comparison(report.comparison) }));
  const timing = steps(report.steps);
  if (timing) lines.push(h("p", { text: `Steps: ${timing}` }));
  if (report.steps && report.steps.to_flip !== undefined) lines.push(h("p", { text: `To flip ${ms(report.steps.to_flip)}, to drained ${ms(report.steps.to_drained)}` }));
  if (report.drained === false) lines.push(h("p", { class: "error", text: `Drain timed out: ${report.in_flight_left} requests were still in flight on the old version.` }));
  if (report.unloaded && report.unloaded.length) lines.push(h("p", { text: `Unloaded: ${report.unloaded.map(v).join(", ")}` }));
  if (report.error) lines.push(h("p", { class: "error", text: report.error }));
  return lines;
}

// -- events -----------------------------------------------------------------------------------------------------

function eventVersions(event) {
  const versions = event.versions || {};
  const detail = event.detail || {};
  if ("from" in versions || "to" in versions) return `${v(versions.from)} → ${v(versions.to)}`;
  if (event.action === "traffic") return detail.canary ? `canary ${split(detail.canary)}` : "canary cleared";
  if (event.action === "shadow") return detail.shadow ? `shadow ${shadowText(detail.shadow)}` : "shadow cleared";
  if (event.action === "canary_rollback") return `canary pulled back: ${detail.bound || ""}`;
  return Object.entries(versions).map(([key, value]) => `${key} ${v(value)}`).join(", ") || "–";
}

function eventDetail(event) {
  if (event.error) return h("span", { class: "error", text: event.step ? `at step '${event.step}': ${event.error}` : event.error });
  const detail = event.detail || {};
  if (detail.comparison) return comparison(detail.comparison);
  if (event.generation !== null && event.generation !== undefined) return `routing generation ${event.generation}`;
  return "";
}

async function refreshEvents(generation) {
  if (!state.names.length) state.names = (await api("GET", "/admin/models")).models.map((model) => model.name);
  const select = $("events-model");
  const wanted = ["", ...state.names];
  if ([...select.options].map((option) => option.value).join() !== wanted.join()) {
    const chosen = select.value;
    select.replaceChildren(h("option", { value: "" }, "All models"), ...state.names.map((name) => h("option", { value: name }, name)));
    if (wanted.includes(chosen)) select.value = chosen;
  }
  // One read per poll: the model's events, or every model's (the newest 200 of the whole audit log).
  const path = select.value ? `/admin/models/${enc(select.value)}/events` : "/admin/events";
  const { events } = await api("GET", `${path}?limit=200`);
  events.sort((a, b) => (a.time < b.time ? 1 : a.time > b.time ? -1 : 0));
  const rows = events.map((event) =>
    h(
      "tr",
      { dataset: { model: event.model, action: event.action } },
      h("td", {}, when(event.time)),
      h("td", { text: event.model }),
      h("td", { text: event.action }),
      h("td", {}, h("span", { class: `result ${event.result}`, text: event.result })),
      h("td", { text: eventVersions(event) }),
      h("td", { text: steps(event.steps) || "–" }),
      h("td", { text: event.actor || "–" }),
      h("td", {}, eventDetail(event)),
    ),
  );
  current(generation);
  const body = $("events-table").tBodies[0];
  body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: "8", text: "No events." }))]));
}

// -- start ------------------------------------------------------------------------------------------------------

$("login-form").addEventListener("submit", signIn);
$("sign-out").addEventListener("click", () => {
  signedOut("Signed out.");
  history.replaceState(null, "", location.pathname);
});
$("models-filter").value = state.filter;
$("models-filter").addEventListener("input", filterChanged);
document.addEventListener("keydown", (event) => {
  // "/" jumps to the filter, as on many sites; not while typing somewhere or with a dialog open.
  if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey || state.view !== "models") return;
  if (event.target.closest("input, select, textarea, dialog")) return;
  event.preventDefault();
  $("models-filter").focus();
});
$("events-model").addEventListener("change", () => restart());
$("events-refresh").addEventListener("click", () => restart());
window.addEventListener("hashchange", route);
route();
