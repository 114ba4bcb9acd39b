// The Tollgate dashboard. It polls GET /v1/stats every second and GET /readyz every other
// second, keeps the last minutes of each limit in memory to draw charts and per-second rates
// (the first poll asks the server for the five minutes it kept before the page opened, so a
// page opened during an incident shows it), lists the limits of an Envoy configuration, and, once an
// operator has entered the admin token, edits limits (PUT /v1/limits/{name}), pauses them
// (POST /v1/pause), lifts pauses (DELETE /v1/limits/{name}/pause), and lists and revokes
// scoped data tokens (GET /v1/tokens every few seconds, DELETE /v1/tokens/{name}).
//
// Safety: every name, key and message from the server reaches the page as text
// (textContent, text nodes) or as a number in an SVG attribute; nothing is parsed as HTML.
// The tokens live in this tab's sessionStorage at most and travel only in the
// Authorization header.
"use strict";

const POLL_MS = 1000;
const READY_EVERY_POLLS = 2;
const TOKENS_EVERY_POLLS = 5;
const HISTORY_MS = 5 * 60 * 1000;
// Rates are measured over a few seconds, so that one slow poll does not make them jump.
const RATE_WINDOW_MS = 5000;
const STORAGE = { admin: "tollgate.adminToken", data: "tollgate.dataToken" };
const SVG_NS = "http://www.w3.org/2000/svg";
// The seconds of history the first poll asks for: what the large chart shows.
const HISTORY_ASKED_S = 300;

const state = {
  adminToken: "",
  dataToken: readStored(STORAGE.data),
  stats: null,
  fetchedAt: 0,
  polls: 0,
  // limit name -> samples [{t, used, capacity, grants, denials: {reason: count}}], oldest first
  history: new Map(),
  historyAsked: false, // the first poll asked for the server's history
  envoyHistory: new Map(), // Envoy entry path -> samples [{t, ok, over}]
  rows: new Map(), // limit name -> the row's elements
  selected: null, // limit name shown in the detail panel
  // The counter of one key of a per-key limit, polled beside the stats.
  keyView: null, // {limit, key, limitStats, samples, error}
  editing: null, // null, {name} when editing, or {name: null} for a new limit
  tokens: null, // the scoped data tokens, as GET /v1/tokens lists them, once read
  tokensUnlisted: false, // the last listing failed, and said so in #tokens-message
};

// ---- Small helpers ------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

// An element with text children only: strings become text nodes, never markup.
function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

// Assigning the same text again still costs a layout; skip it.
function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function show(node, visible) {
  node.hidden = !visible;
}

function readStored(key) {
  try {
    return sessionStorage.getItem(key) || "";
  } catch {
    return ""; // storage disabled: the token lives in memory only
  }
}

function store(key, value) {
  try {
    if (value) sessionStorage.setItem(key, value);
    else sessionStorage.removeItem(key);
  } catch {
    // storage disabled: nothing to do
  }
}

// ---- Formatting ---------------------------------------------------------------------------

const integer = new Intl.NumberFormat("en-US");

function fmtInt(n) {
  return integer.format(n);
}

function fmtRate(perSecond) {
  if (perSecond === null) return "…";
  if (perSecond === 0) return "0";
  if (perSecond < 10) return perSecond.toFixed(1);
  return fmtInt(Math.round(perSecond));
}

// As the server words durations: "250 ms", "1.5 s", "2 min 5 s".
function fmtDuration(ms) {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) {
    const tenths = Math.ceil(ms / 100);
    return tenths % 10 === 0 ? `${tenths / 10} s` : `${(tenths / 10).toFixed(1)} s`;
  }
  const seconds = Math.ceil(ms / 1000);
  const parts = [
    [Math.floor(seconds / 86400), "d"],
    [Math.floor(seconds / 3600) % 24, "h"],
    [Math.floor(seconds / 60) % 60, "min"],
    [seconds % 60, "s"],
  ];
  return parts.filter(([count]) => count > 0).map(([count, unit]) => `${count} ${unit}`).join(" ");
}

function fmtClock(time) {
  const date = new Date(time);
  const two = (n) => String(n).padStart(2, "0");
  return `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`;
}

// What one counter can hold at once, as the server says it (`usage.capacity`); from the rule
// when there is no usage to read (a limit counted per key with no key asked for).
function capacityOf(rule, usage) {
  if (usage && typeof usage.capacity === "number") return usage.capacity;
  return rule.algorithm === "gcra" && rule.burst ? rule.burst : rule.limit;
}

function policyMain(rule) {
  if (rule.kind === "concurrency") {
    return `${fmtInt(rule.limit)} at once, lease ${fmtDuration(rule.lease_ttl_ms)}`;
  }
  let text = `${fmtInt(rule.limit)} per ${fmtDuration(rule.period_ms)}`;
  if (rule.algorithm && rule.algorithm !== "sliding") text += `, ${rule.algorithm}`;
  if (rule.algorithm === "gcra" && rule.burst && rule.burst !== rule.limit) {
    text += ` (burst ${fmtInt(rule.burst)})`;
  }
  return text;
}

function policyExtras(rule) {
  const extras = [];
  if (rule.margin_ms) extras.push(`margin ${fmtDuration(rule.margin_ms)}`);
  const reserve = rule.reserve || {};
  if (reserve.high) extras.push(`${fmtInt(reserve.high)} kept for high`);
  if (reserve.normal) extras.push(`${fmtInt(reserve.normal)} more for normal`);
  if (rule.per) extras.push(`per ${rule.per}`);
  if (rule.match) extras.push(`matches ${rule.match.method} ${rule.match.path}`);
  return extras.join(" · ");
}

// ---- Talking to the server ----------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const detail = (body && body.error) || {};
    super(detail.message || `the server answered HTTP ${status}`);
    this.status = status;
    this.code = detail.code || null;
    this.field = detail.field || null;
  }
}

// Relative URLs, so that the page also works behind a proxy that mounts the server on a path.
async function request(method, path, { token = "", body, allow = [] } = {}) {
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null; // not JSON: reported below by status
  }
  if (!response.ok && !allow.includes(response.status)) throw new ApiError(response.status, data);
  return data;
}

function statsPath(limit, key) {
  if (!limit) return state.historyAsked ? "v1/stats" : `v1/stats?history=${HISTORY_ASKED_S}`;
  const query = new URLSearchParams({ limit });
  if (key) query.set("key", key);
  return `v1/stats?${query}`;
}

// ---- History and rates --------------------------------------------------------------------

// Denials by reason are read from the answer: a reason the server adds shows without a change
// here.
function sampleOf(limit, t) {
  const denials = { ...limit.denials };
  return {
    t,
    used: limit.usage ? limit.usage.used : null,
    capacity: capacityOf(limit.rule, limit.usage),
    grants: limit.grants,
    denied: Object.values(denials).reduce((sum, n) => sum + n, 0),
    denials,
  };
}

// The samples a limit's server-kept history stands for, oldest first, on this page's clock:
// running totals rebuilt from the counts per step. They carry no reasons (the history counts
// denials whole), so the breakdown by reason starts with the page.
function samplesOfHistory(limit, fetchedAt) {
  const history = limit.history;
  if (!history || history.grants.length === 0) return [];
  const n = history.grants.length;
  const samples = new Array(n);
  let grants = history.grants_total;
  let denied = history.denials_total;
  for (let i = n - 1; i >= 0; i--) {
    samples[i] = {
      t: fetchedAt - history.age_ms - (n - 1 - i) * history.step_ms,
      used: history.used[i],
      capacity: capacityOf(limit.rule, limit.usage),
      grants,
      denied,
      denials: {},
    };
    grants -= history.grants[i];
    denied -= history.denials[i];
  }
  return samples.filter((sample) => sample.t < fetchedAt);
}

function remember(samples, sample) {
  const last = samples[samples.length - 1];
  // Counters only grow while a server runs: a drop means it restarted, and the old samples
  // would give negative rates.
  if (last && sample.grants < last.grants) samples.length = 0;
  samples.push(sample);
  while (samples.length > 0 && samples[0].t < sample.t - HISTORY_MS - POLL_MS) samples.shift();
}

// Per-second growth of `pick(sample)` over the last RATE_WINDOW_MS; null before two samples
// that have the value.
function rate(samples, pick) {
  const known = samples.filter((sample) => pick(sample) !== undefined && pick(sample) !== null);
  if (known.length < 2) return null;
  const newest = known[known.length - 1];
  let oldest = known[known.length - 2];
  for (let i = known.length - 2; i >= 0 && known[i].t >= newest.t - RATE_WINDOW_MS; i--) {
    oldest = known[i];
  }
  const seconds = (newest.t - oldest.t) / 1000;
  if (seconds <= 0) return null;
  return Math.max(0, (pick(newest) - pick(oldest)) / seconds);
}

const totalDenials = (sample) => sample.denied;
const grantsOf = (sample) => sample.grants;

// ---- Polling ------------------------------------------------------------------------------

async function poll() {
  const polls = state.polls++;
  const work = [pollStats(), pollKey()];
  if (polls % READY_EVERY_POLLS === 0) work.push(pollReady());
  if (polls % TOKENS_EVERY_POLLS === 0) work.push(pollTokens());
  try {
    await Promise.all(work);
  } finally {
    // The next poll starts after this one ends, so a slow server is never asked twice at once.
    window.setTimeout(poll, POLL_MS);
  }
}

async function pollStats() {
  let stats;
  try {
    stats = await request("GET", statsPath(), { token: state.dataToken });
  } catch (error) {
    document.body.classList.add("stale");
    $("status").className = "status status-bad";
    if (error instanceof ApiError && error.status === 401) {
      setText($("status"), "needs a data token");
      showBanner(`The server asks for a data token to show its stats: ${error.message}`, true);
    } else {
      setText($("status"), `no answer at ${fmtClock(Date.now())}; retrying`);
      showBanner(`Cannot read the stats: ${error.message}`, false);
    }
    return;
  }
  const now = Date.now();
  state.stats = stats;
  state.fetchedAt = now;
  const names = new Set();
  for (const limit of stats.limits) {
    names.add(limit.name);
    if (!state.history.has(limit.name)) state.history.set(limit.name, samplesOfHistory(limit, now));
    remember(state.history.get(limit.name), sampleOf(limit, now));
  }
  state.historyAsked = true;
  rememberEnvoy(stats.envoy, now);
  for (const name of state.history.keys()) {
    if (!names.has(name)) state.history.delete(name);
  }
  hideBanner();
  document.body.classList.remove("stale");
  setText($("status"), `live · updated ${fmtClock(now)}`);
  $("status").className = "status status-ok";
  // Outside the try: a fault in the page's own code must reach the console, not pass for an
  // unreachable server.
  render();
}

async function pollReady() {
  try {
    // 503 carries the same body, naming what is not ready.
    const health = await request("GET", "readyz", { allow: [503] });
    renderHealth($("ready-rules"), health && health.rules);
    renderHealth($("ready-store"), health && health.store);
    setText($("ready-at"), fmtClock(Date.now()));
  } catch (error) {
    renderHealth($("ready-rules"), `no answer: ${error.message}`);
    renderHealth($("ready-store"), `no answer: ${error.message}`);
  }
}

async function pollKey() {
  const view = state.keyView;
  if (!view) return;
  try {
    const stats = await request("GET", statsPath(view.limit, view.key), { token: state.dataToken });
    if (state.keyView !== view) return; // another key was chosen meanwhile
    view.limitStats = stats.limits[0];
    view.error = null;
    remember(view.samples, sampleOf(view.limitStats, Date.now()));
  } catch (error) {
    if (state.keyView !== view) return;
    view.error = error.message;
  }
  renderDetail();
}

// ---- Rendering: the cards -----------------------------------------------------------------

function renderHealth(node, text) {
  const ok = text === "ok";
  setText(node, text || "unknown");
  node.className = ok ? "good" : "bad";
}

function render() {
  const stats = state.stats;
  renderRules(stats.rules);
  renderStore(stats.store);
  renderTraffic(stats.limits);
  renderRejected(stats.rules.rejected);
  renderLimits(stats.limits);
  renderEnvoy(stats.envoy);
  renderAdmin();
  renderDetail();
}

function renderRules(rules) {
  setText($("rules-source"), rules.source);
  setText($("rules-version"), String(rules.version));
  setText(
    $("rules-reload"),
    rules.last_reload_ok
      ? "ok"
      : `failed: ${rules.last_reload_error || "unknown"}; the rules in force stay`,
  );
  $("rules-reload").className = rules.last_reload_ok ? "good" : "bad";
  const reloads = `${fmtInt(rules.reloads_ok)} ok, ${fmtInt(rules.reloads_failed)} failed`;
  setText($("rules-reloads"), reloads);
}

function renderStore(storeView) {
  setText($("store-kind"), storeView.kind);
  const bar = $("store-keys-bar");
  if (storeView.keys_tracked === undefined) {
    setText($("store-keys"), "not counted on this store");
    bar.style.width = "0";
    return;
  }
  const max = storeView.keys_tracked_max;
  const share = max > 0 ? storeView.keys_tracked / max : 0;
  setText($("store-keys"), `${fmtInt(storeView.keys_tracked)} (cap ${fmtInt(max)})`);
  bar.style.width = `${Math.min(100, share * 100)}%`;
  bar.className = `meter-fill${share >= 0.9 ? " meter-high" : share >= 0.7 ? " meter-mid" : ""}`;
}

function renderTraffic(limits) {
  let grants = 0;
  let denials = 0;
  let known = false;
  let waiting = 0;
  let paused = 0;
  for (const limit of limits) {
    const samples = state.history.get(limit.name) || [];
    const g = rate(samples, grantsOf);
    const d = rate(samples, totalDenials);
    if (g !== null) {
      known = true;
      grants += g;
      denials += d;
    }
    waiting += limit.waiting;
    if (limit.usage && limit.usage.paused_ms > 0) paused += 1;
  }
  setText($("total-grants"), known ? `${fmtRate(grants)} /s` : "…");
  setText($("total-denials"), known ? `${fmtRate(denials)} /s` : "…");
  $("total-denials").className = denials > 0 ? "warn" : "";
  setText($("total-waiting"), fmtInt(waiting));
  setText($("total-paused"), fmtInt(paused));
}

// ---- Scoped data tokens (admin) -----------------------------------------------------------

async function pollTokens() {
  const token = state.adminToken;
  if (!token) return;
  try {
    const answer = await request("GET", "v1/tokens", { token });
    if (state.adminToken !== token) return; // locked meanwhile
    state.tokens = answer.tokens;
    // Clears a failure to list, not what a revocation just said.
    if (state.tokensUnlisted) show($("tokens-message"), false);
    state.tokensUnlisted = false;
  } catch (error) {
    if (checkTokenRefused(error)) return;
    state.tokensUnlisted = true;
    showMessage($("tokens-message"), `Cannot list the tokens: ${error.message}`);
  }
  renderTokens();
}

function renderTokens() {
  const admin = Boolean(state.adminToken);
  show($("tokens"), admin && state.tokens !== null);
  if (!admin || state.tokens === null) return;
  const tokens = state.tokens;
  setText($("token-count"), String(tokens.length));
  show($("no-tokens"), tokens.length === 0);
  const body = $("token-rows");
  // Few rows, rarely changing: rebuilt whole, from text.
  const signature = JSON.stringify(tokens);
  if (body.dataset.signature === signature) return;
  body.dataset.signature = signature;
  body.replaceChildren(
    ...tokens.map((token) => {
      const revoke = el("button", "quiet", "Revoke");
      revoke.type = "button";
      revoke.addEventListener("click", () => revokeToken(token.name));
      return el(
        "tr",
        null,
        el("td", "name", token.name),
        el("td", "mono", token.limits.join(", ")),
        el("td", null, token.priority_max),
        el("td", null, token.may_pause ? "yes" : "no"),
        el("td", null, new Date(token.created_ms).toLocaleString()),
        el("td", null, revoke),
      );
    }),
  );
}

async function revokeToken(name) {
  if (!window.confirm(`Revoke the token “${name}”? Callers using it are refused from now on.`)) {
    return;
  }
  try {
    await request("DELETE", `v1/tokens/${encodeURIComponent(name)}`, { token: state.adminToken });
    showMessage($("tokens-message"), `Revoked ${name}.`, true);
  } catch (error) {
    if (checkTokenRefused(error)) return;
    showMessage($("tokens-message"), error.message);
  }
  await pollTokens();
}

function renderRejected(rejected) {
  show($("rejected"), rejected.length > 0);
  setText($("rejected-count"), String(rejected.length));
  const body = $("rejected-rows");
  // Few rows, rarely changing: rebuilt whole, from text.
  const signature = JSON.stringify(rejected);
  if (body.dataset.signature === signature) return;
  body.dataset.signature = signature;
  body.replaceChildren(
    ...rejected.map((row) =>
      el(
        "tr",
        null,
        el("td", "name", row.name),
        el("td", "mono", row.line ? `line ${row.line}: ${row.column}` : row.column),
        el("td", "reason", row.reason),
        el("td", null, row.previous_in_force ? "its previous version" : "nothing"),
      ),
    ),
  );
}

// ---- Rendering: Envoy's limits ------------------------------------------------------------

function rememberEnvoy(envoy, now) {
  const paths = new Set();
  for (const limit of envoy ? envoy.limits : []) {
    paths.add(limit.path);
    if (!state.envoyHistory.has(limit.path)) state.envoyHistory.set(limit.path, []);
    const samples = state.envoyHistory.get(limit.path);
    const last = samples[samples.length - 1];
    // Counts start again when the configuration is read again.
    if (last && limit.ok < last.grants) samples.length = 0;
    samples.push({ t: now, grants: limit.ok, over: limit.over_limit });
    while (samples.length > 0 && samples[0].t < now - RATE_WINDOW_MS - 2 * POLL_MS) samples.shift();
  }
  for (const path of state.envoyHistory.keys()) {
    if (!paths.has(path)) state.envoyHistory.delete(path);
  }
}

function renderEnvoy(envoy) {
  show($("envoy"), Boolean(envoy));
  if (!envoy) return;
  setText($("envoy-count"), String(envoy.limits.length));
  setText(
    $("envoy-summary"),
    `From ${envoy.config}: ${fmtInt(envoy.domains)} domains; ` +
      `${fmtInt(envoy.answered_ok)} requests answered OK, ${fmtInt(envoy.answered_over_limit)} over limit` +
      (envoy.store_failures > 0 ? `, ${fmtInt(envoy.store_failures)} decided without the store` : "") +
      ". Counts start when the configuration is read.",
  );
  const error = $("envoy-error");
  show(error, Boolean(envoy.last_reload_error));
  setText(
    error,
    envoy.last_reload_error
      ? `The last edit was refused, and the configuration before it stays in force: ${envoy.last_reload_error}`
      : "",
  );
  $("envoy-rows").replaceChildren(
    ...envoy.limits.map((limit) => {
      const samples = state.envoyHistory.get(limit.path) || [];
      const okRate = rate(samples, (s) => s.grants);
      const overRate = rate(samples, (s) => s.over);
      const over = el("td", "num", fmtRate(overRate));
      over.classList.toggle("warn", overRate > 0);
      return el(
        "tr",
        null,
        el("td", "name mono", limit.path),
        el("td", null, limit.name || "—"),
        el("td", null, limit.unlimited ? "unlimited" : `${fmtInt(limit.requests_per_unit)} per ${limit.unit}`),
        el("td", null, limit.shadow_mode ? "shadow" : "enforced"),
        el("td", "num", fmtRate(okRate)),
        over,
        el("td", "num", fmtInt(limit.ok)),
        el("td", "num", fmtInt(limit.over_limit)),
      );
    }),
  );
}

// ---- Rendering: the limits table ----------------------------------------------------------

function makeRow(name) {
  // A button, for the keyboard; its click reaches the row's handler.
  const nameButton = el("button", "link", name);
  nameButton.type = "button";
  const cells = {
    name: el("td", "name", nameButton),
    policy: el("td", "policy"),
    used: el("td", "used"),
    grants: el("td", "num"),
    denials: el("td", "num"),
    waiting: el("td", "num"),
    paused: el("td", "paused"),
    chart: el("td", "spark"),
  };
  const row = {
    tr: el("tr", null, ...Object.values(cells)),
    cells,
    policyMain: el("span", null),
    policyExtras: el("span", "sub"),
    usedText: el("span", "used-text"),
    meter: el("div", "meter-fill"),
    pausedText: el("span", null),
    pausedSub: el("span", "sub"),
  };
  row.tr.dataset.limit = name;
  row.tr.addEventListener("click", () => select(name));
  cells.policy.append(row.policyMain, row.policyExtras);
  cells.used.append(row.usedText, el("div", "meter", row.meter));
  cells.paused.append(row.pausedText, row.pausedSub);
  return row;
}

function renderLimits(limits) {
  const body = $("limit-rows");
  const seen = new Set();
  limits.forEach((limit, index) => {
    seen.add(limit.name);
    let row = state.rows.get(limit.name);
    if (!row) {
      row = makeRow(limit.name);
      state.rows.set(limit.name, row);
    }
    updateRow(row, limit);
    if (body.children[index] !== row.tr) body.insertBefore(row.tr, body.children[index] || null);
  });
  for (const [name, row] of state.rows) {
    if (!seen.has(name)) {
      row.tr.remove();
      state.rows.delete(name);
    }
  }
  setText($("limit-count"), String(limits.length));
  show($("no-limits"), limits.length === 0);
  applyFilter();
}

function updateRow(row, limit) {
  const samples = state.history.get(limit.name) || [];
  const capacity = capacityOf(limit.rule, limit.usage);
  row.tr.classList.toggle("selected", state.selected === limit.name);
  setText(row.policyMain, policyMain(limit.rule));
  setText(row.policyExtras, policyExtras(limit.rule));

  const usage = limit.usage;
  row.cells.used.classList.toggle("muted", !usage);
  if (usage) {
    setText(row.usedText, `${fmtInt(usage.used)} / ${fmtInt(capacity)}`);
    setMeter(row.meter, usage.used, capacity);
    row.cells.used.title =
      `${fmtInt(usage.remaining)} remaining; ` +
      `all counted now stops counting in ${fmtDuration(usage.reset_after_ms)}`;
  } else {
    const why = limit.usage_error ? "store did not answer" : `per ${limit.rule.per}: open for a key`;
    setText(row.usedText, why);
    setMeter(row.meter, 0, capacity);
    row.cells.used.title = limit.usage_error || "open the limit and type a key to see its counter";
  }

  const grants = rate(samples, grantsOf);
  const denials = rate(samples, totalDenials);
  setText(row.cells.grants, fmtRate(grants));
  setText(row.cells.denials, fmtRate(denials));
  row.cells.denials.classList.toggle("warn", denials > 0);
  row.cells.denials.title = denialBreakdown(samples);
  setText(row.cells.waiting, fmtInt(limit.waiting));
  row.cells.waiting.classList.toggle("warn", limit.waiting > 0);

  const pausedMs = usage ? usage.paused_ms : 0;
  row.cells.paused.classList.toggle("is-paused", pausedMs > 0);
  setText(row.pausedText, pausedMs > 0 ? `until ${fmtClock(state.fetchedAt + pausedMs)}` : "—");
  setText(row.pausedSub, pausedMs > 0 ? `in ${fmtDuration(pausedMs)}` : "");

  drawChart(row.cells.chart, samples, false);
}

function setMeter(meter, used, capacity) {
  const share = capacity > 0 ? used / capacity : 0;
  meter.style.width = `${Math.min(100, share * 100)}%`;
  meter.className = `meter-fill${share >= 0.9 ? " meter-high" : share >= 0.7 ? " meter-mid" : ""}`;
}

function denialBreakdown(samples) {
  const newest = samples[samples.length - 1];
  return Object.keys(newest ? newest.denials : {})
    .map((reason) => {
      const perSecond = rate(samples, (sample) => sample.denials[reason]);
      return `${reason}: ${fmtRate(perSecond)}/s`;
    })
    .join(", ");
}

function applyFilter() {
  const text = $("filter").value.trim().toLowerCase();
  for (const [name, row] of state.rows) show(row.tr, !text || name.includes(text));
}

// ---- Charts -------------------------------------------------------------------------------

const SPARK = { width: 120, height: 28, pad: { left: 1, right: 1, top: 2, bottom: 2 } };
const LARGE = { width: 640, height: 160, pad: { left: 44, right: 12, top: 10, bottom: 22 } };

// Used against the limit, as an SVG built here. With `axes`, the LARGE chart of the last
// HISTORY_MS with a scale, a time axis and the `rule`'s reserves; without, a SPARK line over
// the history there is (at least a minute), so that it is not a speck at the right while the
// page is new.
function drawChart(container, samples, axes, rule = null) {
  const { width, height, pad } = axes ? LARGE : SPARK;
  const end = state.fetchedAt || Date.now();
  const known = samples.length > 0 ? end - samples[0].t : 0;
  const span = axes ? HISTORY_MS : Math.min(HISTORY_MS, Math.max(60000, known));
  const start = end - span;
  const shown = samples.filter((s) => s.t >= start);
  const last = shown[shown.length - 1];
  const top = 1.15 * Math.max(1, ...shown.map((s) => Math.max(s.capacity, s.used || 0)));
  const plot = { left: pad.left, right: width - pad.right, top: pad.top, bottom: height - pad.bottom };
  const x = (t) => plot.left + ((t - start) / span) * (plot.right - plot.left);
  const y = (v) => plot.bottom - (v / top) * (plot.bottom - plot.top);
  const point = (t, v) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`;

  // The large chart takes its container's width and keeps its proportions.
  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    ...(axes ? { width: "100%" } : { width, height }),
    role: "img",
    class: axes ? "chart-svg" : "spark-svg",
  });
  const title = svg("title");
  title.textContent = last
    ? `used ${last.used === null ? "unknown" : fmtInt(last.used)} of ${fmtInt(last.capacity)}, ` +
      `over the last ${fmtDuration(span)}`
    : "no samples yet";
  chart.append(title);

  if (axes) {
    const label = (attributes, text) => {
      const node = svg("text", { class: "axis", ...attributes });
      node.textContent = text;
      chart.append(node);
    };
    for (const v of [0, last ? last.capacity : 0]) {
      chart.append(svg("line", { x1: plot.left, x2: plot.right, y1: y(v), y2: y(v), class: "grid" }));
      label({ x: plot.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtInt(v));
    }
    for (let minutes = 5; minutes >= 0; minutes--) {
      const t = end - minutes * 60000;
      chart.append(svg("line", { x1: x(t), x2: x(t), y1: plot.top, y2: plot.bottom, class: "grid" }));
      const anchor = minutes === 0 ? "end" : "middle";
      label({ x: x(t), y: height - 6, "text-anchor": anchor }, minutes === 0 ? "now" : `−${minutes} min`);
    }
  }

  // Where the reserves begin: normal (and low) requests are refused above these lines, which
  // explains a usage that levels off below the limit.
  if (axes && last && rule && rule.reserve) {
    const high = rule.reserve.high || 0;
    const normal = rule.reserve.normal || 0;
    const ceilings = [];
    if (high > 0) ceilings.push([last.capacity - high, "normal priority stops here"]);
    if (normal > 0) ceilings.push([last.capacity - high - normal, "low priority stops here"]);
    for (const [v, text] of ceilings) {
      chart.append(svg("line", { x1: plot.left, x2: plot.right, y1: y(v), y2: y(v), class: "line-reserve" }));
      const note = svg("text", { x: plot.left + 6, y: y(v) - 4, class: "axis" });
      note.textContent = `${text} (${fmtInt(v)})`;
      chart.append(note);
    }
  }

  // The limit as a step line: it changes only when the rule does. The first is drawn back to
  // the left edge, as the reference the used line is read against.
  if (last) {
    const steps = [point(start, shown[0].capacity)];
    shown.forEach((s, i) => {
      if (i > 0 && shown[i - 1].capacity !== s.capacity) steps.push(point(s.t, shown[i - 1].capacity));
      steps.push(point(s.t, s.capacity));
    });
    steps.push(point(end, last.capacity));
    chart.append(svg("polyline", { points: steps.join(" "), class: "line-limit" }));
  }

  // Used, in runs broken where the store did not answer.
  const runs = [[]];
  for (const s of shown) {
    if (s.used !== null) runs[runs.length - 1].push(s);
    else if (runs[runs.length - 1].length > 0) runs.push([]);
  }
  for (const run of runs.filter((r) => r.length > 0)) {
    // A lone sample is drawn as one poll's worth of line, so that it shows.
    const line = run.length > 1 ? run : [{ ...run[0], t: run[0].t - POLL_MS }, run[0]];
    const points = line.map((s) => point(s.t, s.used));
    if (axes) {
      const floor = [point(line[line.length - 1].t, 0), point(line[0].t, 0)];
      chart.append(svg("polygon", { points: [...points, ...floor].join(" "), class: "area-used" }));
    }
    chart.append(svg("polyline", { points: points.join(" "), class: "line-used" }));
  }

  container.replaceChildren(chart);
}

// ---- The detail panel ---------------------------------------------------------------------

function select(name) {
  if (state.selected !== name) {
    state.selected = name;
    state.keyView = null;
    $("key-input").value = "";
    $("pause-key").value = "";
    show($("key-message"), false);
    show($("pause-message"), false);
  }
  if (state.stats) render();
  $("detail").scrollIntoView({ block: "nearest" });
}

function selectedLimit() {
  if (!state.stats || !state.selected) return null;
  return state.stats.limits.find((limit) => limit.name === state.selected) || null;
}

function renderDetail() {
  const limit = selectedLimit();
  show($("detail"), limit !== null);
  if (!limit) return;
  const rule = limit.rule;
  const perKey = Boolean(rule.per);
  setText($("detail-title"), limit.name);
  const extras = policyExtras(rule);
  setText($("detail-policy"), `${rule.kind}: ${policyMain(rule)}${extras ? ` · ${extras}` : ""}`);
  show($("key-form"), perKey);
  show($("pause-key-label"), perKey);

  // For a per-key limit, the counter shown is the chosen key's.
  const view = perKey && state.keyView && state.keyView.limit === limit.name ? state.keyView : null;
  const limitSamples = state.history.get(limit.name) || [];
  const counter = perKey ? view && view.limitStats : limit;
  if (view && view.error) setText($("key-message"), view.error);
  show($("key-message"), Boolean(view && view.error));
  let caption = "Used against the limit";
  if (view) caption = `Counter of key “${view.key}”`;
  else if (perKey) caption = `One counter per ${rule.per}: type a key to see its usage.`;
  setText($("chart-caption"), caption);
  drawChart($("chart"), perKey ? (view ? view.samples : []) : limitSamples, true, rule);

  const items = [];
  const usage = counter && counter.usage;
  if (usage) {
    const paused = usage.paused_ms > 0;
    const pauseEnd = fmtClock(state.fetchedAt + usage.paused_ms);
    items.push(["Used now", `${fmtInt(usage.used)} of ${fmtInt(capacityOf(rule))}`]);
    items.push(["Remaining", fmtInt(usage.remaining)]);
    const resets = usage.reset_after_ms > 0 ? fmtDuration(usage.reset_after_ms) : "nothing counted";
    items.push(["All counted ends in", resets]);
    items.push(["Paused", paused ? `until ${pauseEnd} (${fmtDuration(usage.paused_ms)} from now)` : "no"]);
  } else if (counter && counter.usage_error) {
    items.push(["Used now", `unknown: ${counter.usage_error}`]);
  } else if (view) {
    items.push(["Used now", "reading…"]);
  }
  if (perKey && !view && limit.hot_keys && limit.hot_keys.length > 0) {
    const hottest = limit.hot_keys.map((hot) => {
      const used = hot.usage ? `${fmtInt(hot.usage.used)} of ${fmtInt(hot.usage.capacity)}` : "unknown";
      return `${hot.key}: ${used} used, ${fmtInt(hot.requests)} asked`;
    });
    items.push(["Most asked-for keys", hottest.join("; ")]);
  }
  // What a vendor taught (POST /v1/learn), and the grant-to-send delay callers report.
  const learned = limit.learned;
  if (learned && learned.learned) {
    const taught = learned.learned;
    const how = taught.kind === "rate_limited"
      ? `lowered by rate-limit answers, a step back up in ${fmtDuration(taught.expires_in_ms)}`
      : `advertised, expires in ${fmtDuration(taught.expires_in_ms)}`;
    items.push(["Learned from the vendor", `${fmtInt(learned.effective)} of ${fmtInt(learned.configured)} in force, from ${taught.source} (${how})`]);
  }
  if (learned && learned.delay_ms > 0) {
    const margin = Math.max(rule.margin_ms || 0, learned.margin_ms);
    const warn = margin < learned.delay_ms ? " — below the delay: the vendor may count more than the limit" : "";
    items.push(["Grant-to-send delay", `up to ${fmtDuration(learned.delay_ms)}; margin in force ${fmtDuration(margin)}${warn}`]);
  }
  // The server counts waiters, grants and denials per limit, never per key.
  const allKeys = perKey ? " (all keys)" : "";
  const denied = Object.values(limit.denials).reduce((sum, n) => sum + n, 0);
  const reasons = Object.keys(limit.denials).filter((r) => limit.denials[r] > 0);
  const by = limit.waiting_by_priority;
  const levels = by ? ` (high ${fmtInt(by.high)}, normal ${fmtInt(by.normal)}, low ${fmtInt(by.low)})` : "";
  items.push([`Waiting${allKeys}`, `${fmtInt(limit.waiting)}${levels}`]);
  const grantRate = fmtRate(rate(limitSamples, grantsOf));
  const denialRate = fmtRate(rate(limitSamples, totalDenials));
  items.push([`Grants${allKeys}`, `${grantRate} /s, ${fmtInt(limit.grants)} since start`]);
  items.push([`Denials${allKeys}`, `${denialRate} /s, ${fmtInt(denied)} since start`]);
  if (reasons.length > 0) {
    items.push(["By reason", reasons.map((r) => `${r} ${fmtInt(limit.denials[r])}`).join(", ")]);
  }
  const list = items.flatMap(([term, value]) => [el("dt", null, term), el("dd", null, value)]);
  $("detail-stats").replaceChildren(...list);
}

// ---- Admin: token, edit, pause ------------------------------------------------------------

function rulesFromFile() {
  return Boolean(state.stats && state.stats.rules.writable === false);
}

function renderAdmin() {
  const admin = Boolean(state.adminToken);
  const fromFile = rulesFromFile();
  show($("token-form"), !admin);
  show($("admin-on"), admin);
  show($("read-only"), !admin);
  show($("actions"), admin && !fromFile);
  show($("new-limit"), admin && !fromFile);
  show($("pause-form"), admin);
  show($("file-note"), admin && fromFile);
  if (fromFile) {
    const path = state.stats.rules.source.slice("file ".length);
    setText(
      $("file-note"),
      `The limits come from the file ${path}: change them there; the server reloads it. ` +
        "Pausing still works.",
    );
  }
  if (!admin || fromFile) closeEditor();
  renderTokens();
}

function showMessage(node, text, ok) {
  setText(node, text);
  node.classList.toggle("ok", Boolean(ok));
  show(node, Boolean(text));
}

async function unlock(token) {
  const message = $("token-message");
  try {
    // Any admin call checks the token; listing the limits changes nothing.
    await request("GET", "v1/limits", { token });
    state.adminToken = token;
    store(STORAGE.admin, token);
    show(message, false);
    pollTokens();
  } catch (error) {
    state.adminToken = "";
    store(STORAGE.admin, "");
    showMessage(message, `The admin token was not accepted: ${error.message}`);
  }
  if (state.stats) render();
  else renderAdmin();
}

function lock() {
  state.adminToken = "";
  state.tokens = null;
  store(STORAGE.admin, "");
  $("admin-token").value = "";
  if (state.stats) render();
  else renderAdmin();
}

// An admin call the server refused for the token: the page goes back to read-only.
function checkTokenRefused(error) {
  if (error instanceof ApiError && error.status === 401) {
    lock();
    showMessage($("token-message"), `The admin token is no longer accepted: ${error.message}`);
    return true;
  }
  return false;
}

const editForm = () => $("edit-form");

function field(name) {
  return editForm().elements.namedItem(name);
}

function openEditor(rule) {
  const creating = rule === null;
  state.editing = { name: creating ? null : rule.name };
  const r = rule || { kind: "rate", algorithm: "sliding" };
  setText($("edit-title"), creating ? "New limit" : `Edit ${rule.name}`);
  const values = {
    name: creating ? "" : rule.name,
    kind: r.kind,
    limit: r.limit,
    period_ms: r.period_ms,
    algorithm: r.algorithm || "sliding",
    burst: r.burst,
    margin_ms: r.margin_ms,
    lease_ttl_ms: r.lease_ttl_ms,
    "reserve.high": r.reserve && r.reserve.high,
    "reserve.normal": r.reserve && r.reserve.normal,
    per: r.per,
    "match.method": r.match && r.match.method,
    "match.path": r.match && r.match.path,
  };
  for (const [name, value] of Object.entries(values)) {
    const input = field(name);
    input.value = value === undefined || value === null ? "" : String(value);
    input.removeAttribute("aria-invalid");
  }
  field("name").readOnly = !creating;
  updateEditorFields();
  show($("edit-message"), false);
  show($("editor"), true);
  $("editor").scrollIntoView({ block: "nearest" });
  (creating ? field("name") : field("limit")).focus();
}

function closeEditor() {
  state.editing = null;
  show($("editor"), false);
}

// Only the fields of the chosen kind (and algorithm) are shown and sent.
function updateEditorFields() {
  const kind = field("kind").value;
  const gcra = kind === "rate" && field("algorithm").value === "gcra";
  for (const label of editForm().querySelectorAll("label[data-kind]")) {
    const wanted = label.dataset.kind;
    show(label, wanted === kind || (wanted === "gcra" && gcra));
  }
}

// The rule as the admin API takes it. Numbers that do not parse are sent as typed, so that
// the server's message names the field.
function ruleFromEditor() {
  const rule = { kind: field("kind").value };
  const visible = (name) => !field(name).closest("label").hidden;
  const value = (name) => field(name).value.trim();
  const number = (name) => {
    const text = value(name);
    return /^-?\d+$/.test(text) ? Number(text) : text;
  };
  for (const name of ["limit", "period_ms", "burst", "margin_ms", "lease_ttl_ms"]) {
    if (visible(name) && value(name) !== "") rule[name] = number(name);
  }
  if (visible("algorithm")) rule.algorithm = value("algorithm");
  const reserve = {};
  for (const level of ["high", "normal"]) {
    if (value(`reserve.${level}`) !== "") reserve[level] = number(`reserve.${level}`);
  }
  if (Object.keys(reserve).length > 0) rule.reserve = reserve;
  if (value("per") !== "") rule.per = value("per");
  if (value("match.method") !== "" || value("match.path") !== "") {
    rule.match = {};
    if (value("match.method") !== "") rule.match.method = value("match.method");
    if (value("match.path") !== "") rule.match.path = value("match.path");
  }
  return rule;
}

async function saveEditor(event) {
  event.preventDefault();
  if (!state.editing) return;
  const name = state.editing.name || field("name").value.trim();
  const message = $("edit-message");
  for (const input of editForm().elements) input.removeAttribute("aria-invalid");
  if (!name) {
    field("name").setAttribute("aria-invalid", "true");
    showMessage(message, "name: a new limit needs a name");
    return;
  }
  try {
    const stored = await request("PUT", `v1/limits/${encodeURIComponent(name)}`, {
      token: state.adminToken,
      body: ruleFromEditor(),
    });
    showMessage(message, `Saved. In force now: ${policyMain(stored)}.`, true);
    if (!state.editing.name) {
      state.editing.name = name;
      field("name").readOnly = true;
      setText($("edit-title"), `Edit ${name}`);
      select(name);
    }
    await pollStats();
  } catch (error) {
    if (checkTokenRefused(error)) return;
    showMessage(message, error.message);
    // `reserve.high`, `match.path` or a whole object such as `reserve`.
    const name = error.field && CSS.escape(error.field);
    const input = name && editForm().querySelector(`[name="${name}"], [name^="${name}."]`);
    if (input) {
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  }
}

async function pause(event) {
  event.preventDefault();
  const limit = selectedLimit();
  if (!limit) return;
  const message = $("pause-message");
  const seconds = Number($("pause-seconds").value);
  if (!(seconds > 0)) {
    showMessage(message, "retry_after_ms: give a number of seconds above 0");
    return;
  }
  const body = { limit: limit.name, retry_after_ms: Math.round(seconds * 1000) };
  const key = $("pause-key").value;
  if (limit.rule.per && key !== "") body.key = key;
  try {
    // The data plane's call: it takes the data token, if the server has one.
    const answer = await request("POST", "v1/pause", { token: state.dataToken, body });
    const until = fmtClock(Date.now() + answer.paused_ms);
    const what = body.key === undefined ? "" : ` for key “${body.key}”`;
    showMessage(message, `Paused${what} until ${until} (${fmtDuration(answer.paused_ms)}).`, true);
    await pollStats();
  } catch (error) {
    showMessage(message, error.message);
  }
}

// The admin API's call: an administrator lifts the limit-wide pause, or one key's own.
async function resume() {
  const limit = selectedLimit();
  if (!limit) return;
  const message = $("pause-message");
  const key = limit.rule.per ? $("pause-key").value : "";
  const query = key === "" ? "" : `?key=${encodeURIComponent(key)}`;
  try {
    const path = `v1/limits/${encodeURIComponent(limit.name)}/pause${query}`;
    const answer = await request("DELETE", path, { token: state.adminToken });
    const what = key === "" ? "" : ` for key “${key}”`;
    showMessage(message, answer.resumed ? `Resumed${what}.` : `No pause was on${what}.`, true);
    await pollStats();
  } catch (error) {
    if (checkTokenRefused(error)) return;
    showMessage(message, error.message);
  }
}

function showKey(event) {
  event.preventDefault();
  const limit = selectedLimit();
  const key = $("key-input").value;
  show($("key-message"), false);
  if (!limit || key === "") {
    state.keyView = null;
  } else {
    state.keyView = { limit: limit.name, key, limitStats: null, samples: [], error: null };
    $("pause-key").value = key;
  }
  renderDetail();
  pollKey();
}

// ---- Banner -------------------------------------------------------------------------------

function showBanner(text, askDataToken) {
  setText($("banner-text"), text);
  show($("data-token-form"), askDataToken);
  show($("banner"), true);
}

function hideBanner() {
  show($("banner"), false);
}

// ---- Start --------------------------------------------------------------------------------

function start() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("admin-token").value.trim();
    $("admin-token").value = "";
    if (token) unlock(token);
  });
  $("lock").addEventListener("click", lock);
  $("data-token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.dataToken = $("data-token").value.trim();
    $("data-token").value = "";
    store(STORAGE.data, state.dataToken);
    pollStats();
  });
  $("filter").addEventListener("input", applyFilter);
  $("detail-close").addEventListener("click", () => {
    state.selected = null;
    state.keyView = null;
    if (state.stats) render();
  });
  $("key-form").addEventListener("submit", showKey);
  $("key-clear").addEventListener("click", () => {
    $("key-input").value = "";
    state.keyView = null;
    show($("key-message"), false);
    renderDetail();
  });
  $("edit").addEventListener("click", () => {
    const limit = selectedLimit();
    if (limit) openEditor({ ...limit.rule, name: limit.name });
  });
  $("new-limit").addEventListener("click", () => openEditor(null));
  $("edit-cancel").addEventListener("click", closeEditor);
  editForm().addEventListener("submit", saveEditor);
  field("kind").addEventListener("change", updateEditorFields);
  field("algorithm").addEventListener("change", updateEditorFields);
  $("pause-form").addEventListener("submit", pause);
  $("resume").addEventListener("click", resume);

  renderAdmin();
  const token = readStored(STORAGE.admin);
  if (token) unlock(token);
  poll();
}

document.addEventListener("DOMContentLoaded", start);
