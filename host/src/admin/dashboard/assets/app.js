// Switchyard's operator dashboard. It holds no data of its own: every few seconds it reads the
// admin views with the token the operator typed in (kept in this tab's sessionStorage, sent as
// `Authorization: Bearer`) and draws them. Weight changes go through the admin API's
// `PUT /admin/routing/weights` and `POST /admin/routing/providers/{target}/{action}`.
'use strict';

const TOKEN_KEY = 'switchyard.adminToken';
const POLL_MS = 3000;
// Relative to /ui/, so the page also works behind a proxy that serves the gateway under a prefix.
const API = {
  routing: '../routing',
  deep: '../health/deep',
  weights: '../admin/routing/weights',
  metrics: '../metrics',
  logs: '../admin/logs',
  budgets: '../admin/budgets',
  provider: (target, action) =>
    `../admin/routing/providers/${encodeURIComponent(target)}/${action}`,
};
const PALETTE = ['#2f6fde', '#e07b24', '#2a9d6f', '#c4407a', '#7a5bd6', '#8a8f2b', '#1f9bb5', '#b04a3a'];

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  timer: null,
  polling: false,
  again: false,     // a poll was asked for while one ran
  counters: null,   // the previous /metrics counters, for rates
  weightsKey: null, // what the weights form was drawn from
  colors: new Map(),
};

const $ = (id) => document.getElementById(id);

/** An element with attributes and children; strings become text nodes (never HTML). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// ---- talking to the gateway ----------------------------------------------------------------

class HttpError extends Error {
  constructor(path, status, message) {
    super(`${path}: ${status} ${message}`);
    this.status = status;
    this.detail = message;
  }
}

async function call(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    cache: 'no-store',
    headers: { ...(options.headers || {}), Authorization: `Bearer ${state.token}` },
  });
  if (!response.ok) {
    let message = response.statusText;
    try {
      const body = await response.json();
      message = (body.error && body.error.message) || message;
    } catch (_) { /* not JSON: keep the status text */ }
    throw new HttpError(path.replace(/^\.\./, ''), response.status, message);
  }
  return response;
}

const getJson = async (path) => (await call(path)).json();
const getText = async (path) => (await call(path)).text();
const refused = (e) => e instanceof HttpError && (e.status === 401 || e.status === 403);

// ---- signing in and out --------------------------------------------------------------------

async function signIn(event) {
  event.preventDefault();
  const token = $('token').value.trim();
  if (!token) return;
  state.token = token;
  $('login-error').textContent = '';
  try {
    // One small admin call proves the token before anything is shown.
    await call(API.weights);
  } catch (e) {
    state.token = null;
    $('login-error').textContent = refused(e)
      ? `The gateway refused this token (${e.status}): ${e.detail}`
      : `Cannot reach the gateway: ${e.message}`;
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  showDashboard();
}

function signOut(reason) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  clearTimeout(state.timer);
  state.counters = null;
  state.weightsKey = null;
  // Nothing read with the token stays on the page.
  for (const id of ['models', 'endpoints', 'weights', 'chart-ttft', 'chart-latency', 'requests']) {
    $(id).replaceChildren();
  }
  $('problems').textContent = '';
  $('logs-note').textContent = '';
  $('dashboard').hidden = true;
  $('logout').hidden = true;
  $('pause-label').hidden = true;
  $('gateway-status').hidden = true;
  $('updated').textContent = '';
  $('login').hidden = false;
  $('login-error').textContent = reason || '';
  $('token').focus();
}

function showDashboard() {
  $('login').hidden = true;
  $('dashboard').hidden = false;
  $('logout').hidden = false;
  $('pause-label').hidden = false;
  poll();
}

// ---- polling -------------------------------------------------------------------------------

function logsUrl() {
  const query = new URLSearchParams({ limit: $('filter-limit').value });
  if ($('filter-model').value) query.set('model', $('filter-model').value);
  if ($('filter-status').value) query.set('status', $('filter-status').value);
  return `${API.logs}?${query}`;
}

async function poll() {
  clearTimeout(state.timer);
  if (!state.token) return;
  if (state.polling) { state.again = true; return; }
  state.polling = true;
  try {
    const [routing, deep, weights, metrics, logs, budgets] = await Promise.allSettled([
      getJson(API.routing), getJson(API.deep), getJson(API.weights),
      getText(API.metrics), getJson(logsUrl()), getJson(API.budgets),
    ]);
    const all = [routing, deep, weights, metrics, logs, budgets];
    const denied = all.find((r) => r.status === 'rejected' && refused(r.reason));
    if (denied) {
      signOut(`Signed out: the gateway refused the token (${denied.reason.status}): ${denied.reason.detail}`);
      return;
    }
    render({
      routing: routing.value, deep: deep.value, weights: weights.value,
      metrics: metrics.status === 'fulfilled' ? parseMetrics(metrics.value) : null,
      logs, budgets, problems: [routing, deep, weights, metrics]
        .filter((r) => r.status === 'rejected').map((r) => r.reason.message),
    });
  } finally {
    state.polling = false;
    const wait = state.again ? 0 : POLL_MS;
    state.again = false;
    if (state.token && (wait === 0 || !$('pause').checked)) state.timer = setTimeout(poll, wait);
  }
}

function render(data) {
  const now = new Date();
  $('updated').textContent = `updated ${clock(now.getTime())}`;
  $('problems').textContent = data.problems.join(' · ');
  if (data.deep) {
    const pill = $('gateway-status');
    pill.hidden = false;
    pill.textContent = data.deep.status;
    pill.className = `pill ${data.deep.status === 'ok' ? 'good' : 'bad'}`;
  }
  const rates = data.metrics ? ratesFrom(data.metrics, now.getTime()) : null;
  if (data.routing) {
    renderModels(data.routing, data.deep, rates);
    renderEndpoints(data.routing, data.deep, data.weights, rates);
    if (data.weights) renderWeights(data.routing, data.weights);
    updateModelFilter(data.routing);
  }
  renderRequests(data.logs);
  renderLimits(data.budgets, data.metrics);
}

// ---- budgets and rate limits ---------------------------------------------------------------

/** Each budget's spend against its limit in the current period, and the rate limits' refusals. */
function renderLimits(budgets, metrics) {
  if (budgets.status === 'rejected') {
    const e = budgets.reason;
    const why = e.status === 404 ? 'this gateway has no GET /admin/budgets' : e.detail || e.message;
    $('budgets-note').textContent = `Budgets not available (${why}).`;
    $('budgets').replaceChildren();
  } else {
    const list = budgets.value || [];
    $('budgets-note').textContent = list.length ? '' : 'No budgets.';
    const head = el('tr', {}, ...['budget', 'period', 'mode', 'spent', 'limit', 'used', 'remaining', 'resets']
      .map((h) => el('th', {}, h)));
    const rows = list.map((b) => {
      const used = b.limit_usd > 0 ? Math.max(0, b.spent_usd / b.limit_usd) : 0;
      const over = b.remaining_usd <= 0;
      return el('tr', { class: over ? 'failed' : '', dataset: { budget: b.id } },
        el('td', {}, `${b.scope}:${b.subject}`),
        el('td', {}, b.period),
        el('td', {}, el('span', { class: `pill ${b.mode === 'hard' ? 'bad' : 'warn'} small` }, b.mode)),
        el('td', { class: 'num' }, usd(b.spent_usd)),
        el('td', { class: 'num' }, usd(b.limit_usd)),
        el('td', {}, el('div', { class: 'bar', title: `${(used * 100).toFixed(1)} %` },
          fill(`fill ${over ? 'bad' : used > 0.8 ? 'warn' : 'good'}`, used))),
        el('td', { class: 'num' }, usd(b.remaining_usd)),
        el('td', { class: 'nowrap' }, b.period_end_ms ? clock(b.period_end_ms) : 'never'));
    });
    $('budgets').replaceChildren(el('thead', {}, head), el('tbody', {}, ...rows));
  }
  // Refusals of each route's rate limits since the gateway started (`switchyard_rate_limited_total`).
  const refusals = metrics
    ? metrics.filter((s) => s.name === 'switchyard_rate_limited_total')
    : [];
  $('rate-limits').replaceChildren(...(refusals.length
    ? [el('thead', {}, el('tr', {}, el('th', {}, 'route'), el('th', {}, 'limit'), el('th', {}, 'refused'))),
      el('tbody', {}, ...refusals.map((s) => el('tr', {},
        el('td', {}, s.labels.route), el('td', {}, s.labels.limit), el('td', { class: 'num' }, s.value))))]
    : [el('tbody', {}, el('tr', {}, el('td', { class: 'muted' }, 'No request refused by a rate limit.')))]));
}

/** A bar's filled part. Its width is set through the CSSOM: the page's policy forbids inline
 * style attributes. */
function fill(cls, fraction) {
  const node = el('div', { class: cls });
  node.style.width = `${Math.min(100, fraction * 100).toFixed(1)}%`;
  return node;
}

function usd(value) {
  return typeof value === 'number' ? `$${value.toFixed(4)}` : '–';
}

// ---- /metrics ------------------------------------------------------------------------------

/** The Prometheus text format, one sample per line: `name{label="value",...} number`. */
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

function sumBy(samples, name, label, keep = () => true) {
  const sums = new Map();
  for (const s of samples) {
    if (s.name !== name || !keep(s.labels)) continue;
    const key = s.labels[label];
    sums.set(key, (sums.get(key) || 0) + s.value);
  }
  return sums;
}

/** Per-second rates since the previous poll, and the gauges as they stand. */
function ratesFrom(samples, at) {
  const counters = {
    at,
    attempts: sumBy(samples, 'gen_ai_client_operation_duration_seconds_count', 'endpoint'),
    failed: sumBy(samples, 'gen_ai_client_operation_duration_seconds_count', 'endpoint',
      (l) => l.error_type !== 'none'),
    requests: sumBy(samples, 'gen_ai_server_request_duration_seconds_count', 'model'),
  };
  const previous = state.counters;
  state.counters = counters;
  const rate = (kind, key) => {
    if (!previous) return null;
    const seconds = (at - previous.at) / 1000;
    const delta = (counters[kind].get(key) || 0) - (previous[kind].get(key) || 0);
    // A counter that went down belongs to a restarted process: no rate this round.
    return seconds > 0 && delta >= 0 ? delta / seconds : null;
  };
  return {
    rate,
    inFlight: sumBy(samples, 'switchyard_endpoint_in_flight', 'endpoint'),
  };
}

// ---- models --------------------------------------------------------------------------------

function renderModels(routing, deep, rates) {
  const routers = new Map(((deep && deep.routers) || []).map((r) => [r.model, r]));
  const rows = routing.models.map((m) => {
    const stats = routers.get(m.id) || {};
    return el('tr', { dataset: { model: m.id } },
      el('td', {}, el('strong', {}, m.id),
        m.aliases.length ? el('div', { class: 'muted small' }, `aliases: ${m.aliases.join(', ')}`) : null),
      el('td', {}, el('span', { class: 'tag' }, m.router), el('span', { class: 'muted small' }, ` ${m.router_version}`)),
      el('td', { class: 'num' }, m.routes.length),
      el('td', { class: 'num' }, rates ? perSecond(rates.rate('requests', m.id)) : '–'),
      el('td', { class: 'num' }, stats.selects ?? '–'),
      el('td', { class: 'num' }, stats.failures ?? '–',
        stats.last_failure ? el('div', { class: 'error small' }, stats.last_failure) : null),
      el('td', { class: 'small' }, m.share_basis,
        m.strategy_status ? details(`status-${m.id}`, 'strategy status', JSON.stringify(m.strategy_status, null, 2)) : null));
  });
  replaceKeepingOpen($('models'), [
    head(['Model', 'Strategy', '#Upstreams', '#Requests/s', '#Selects', '#Strategy failures', 'How primaries are chosen']),
    el('tbody', {}, rows),
  ]);
}

// ---- endpoints -----------------------------------------------------------------------------

function renderEndpoints(routing, deep, weights, rates) {
  const health = new Map(((deep && deep.endpoints) || []).map((e) => [e.endpoint_id, e]));
  const prefill = (deep && deep.prefill) || {};
  const disabled = new Set((weights && weights.disabled) || []);
  const rows = [];
  for (const m of routing.models) {
    for (const r of m.routes) {
      const h = health.get(r.endpoint_id) || {};
      const circuit = h.circuit || r.circuit;
      const load = prefill[r.endpoint_id] || {};
      const off = disabled.has(r.endpoint_id) || disabled.has(r.provider);
      rows.push(el('tr', { dataset: { endpoint: r.endpoint_id } },
        el('td', {}, el('strong', { class: 'mono' }, r.endpoint_id),
          el('div', { class: 'muted small' }, `${r.base_url} · ${r.provider_model_id}`)),
        el('td', {}, r.provider),
        el('td', { class: 'circuit' }, el('span', { class: `pill ${circuitClass(circuit)}` }, circuit.replace('_', '-')),
          h.seconds_to_half_open ? el('div', { class: 'muted small' }, `half-open in ${Math.ceil(h.seconds_to_half_open)} s`) : null,
          off ? el('div', { class: 'pill bad small' }, 'disabled') : null),
        el('td', { class: 'num' }, percent(h.availability ?? r.availability)),
        el('td', { class: 'num' }, h.successes ?? 0, ' / ', h.failures ?? 0),
        el('td', { class: 'num' }, rates ? (rates.inFlight.get(r.endpoint_id) ?? 0) : '–'),
        el('td', { class: 'num' }, rates ? perSecond(rates.rate('attempts', r.endpoint_id)) : '–'),
        el('td', { class: 'num' }, rates ? perSecond(rates.rate('failed', r.endpoint_id)) : '–'),
        el('td', { class: 'num' }, integer(load.backlog_tokens ?? 0),
          load.elephants ? el('div', { class: 'muted small' }, `${load.elephants} elephant(s)`) : null),
        el('td', { class: 'small error wrap' }, h.last_error || '')));
    }
  }
  $('endpoints').replaceChildren(
    head(['Endpoint', 'Provider', 'Circuit', '#Availability', '#OK / failed', '#In flight',
      '#Attempts/s', '#Failed/s', '#Prefill backlog (tokens)', 'Last error']),
    el('tbody', {}, rows));
}

function circuitClass(circuit) {
  return circuit === 'closed' ? 'good' : circuit === 'open' ? 'bad' : 'warn';
}

// ---- weights -------------------------------------------------------------------------------

function renderWeights(routing, weights) {
  const container = $('weights');
  const key = JSON.stringify([routing.models.map((m) => [m.id, m.routes.map((r) =>
    [r.endpoint_id, r.weight, r.declared_weight, r.share, r.priority])]), weights]);
  // Never redraw under the operator's hands: keep the form while a field is edited.
  const focused = document.activeElement;
  const editing = (container.contains(focused) && focused.matches('input')) ||
    container.querySelector('input[data-dirty]');
  if (key === state.weightsKey || editing) return;
  state.weightsKey = key;
  const disabled = new Set(weights.disabled || []);
  const forms = routing.models.map((m) => {
    const overrides = (weights.weights || {})[m.id] || {};
    const message = el('span', { class: 'small' });
    const rows = m.routes.map((r) => {
      const input = el('input', {
        type: 'number', min: '0', step: 'any', class: 'weight',
        placeholder: String(r.declared_weight), 'aria-label': `override for ${r.endpoint_id}`,
        dataset: { endpoint: r.endpoint_id },
        oninput: (e) => { e.target.dataset.dirty = ''; },
      });
      if (r.endpoint_id in overrides) input.value = overrides[r.endpoint_id];
      return el('tr', {},
        el('td', { class: 'mono' }, r.endpoint_id),
        el('td', { class: 'num' }, r.priority),
        el('td', { class: 'num' }, r.declared_weight),
        el('td', {}, input),
        el('td', { class: 'num effective' }, r.weight),
        el('td', { class: 'num' }, r.share === null ? '–' : percent(r.share)),
        el('td', {}, toggle(r, disabled, message)));
    });
    const apply = async (weightsMap, verb) => {
      message.className = 'small';
      message.textContent = `${verb}…`;
      try {
        await call(API.weights, {
          method: 'PUT',
          headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ model: m.id, weights: weightsMap }),
        });
        state.weightsKey = null;
        for (const i of container.querySelectorAll('input[data-dirty]')) delete i.dataset.dirty;
        await poll();
        // The form was redrawn: say so on the new one.
        const fresh = container.querySelector(`form[data-model="${CSS.escape(m.id)}"] .result`);
        if (fresh) fresh.textContent = `${verb}: done`;
      } catch (e) {
        if (refused(e)) { signOut(`Signed out: ${e.message}`); return; }
        message.className = 'small error';
        message.textContent = e.detail || e.message;
      }
    };
    const form = el('form', {
      class: 'weights', dataset: { model: m.id },
      onsubmit: (e) => {
        e.preventDefault();
        const map = {};
        for (const i of form.querySelectorAll('input.weight')) {
          const text = i.value.trim();
          if (text !== '') map[i.dataset.endpoint] = Number.isFinite(Number(text)) ? Number(text) : text;
        }
        apply(map, 'Applied');
      },
    },
    el('h3', {}, m.id, ' ', el('span', { class: 'tag' }, m.router),
      Object.keys(overrides).length ? el('span', { class: 'pill warn small' }, 'overridden') : null),
    el('table', { class: 'grid compact' },
      head(['Endpoint', '#Priority', '#Declared', 'Override', '#Effective', '#Share of primaries', '']),
      el('tbody', {}, rows)),
    el('div', { class: 'actions' },
      el('button', { type: 'submit', class: 'apply' }, 'Apply overrides'),
      el('button', { type: 'button', class: 'secondary clear', onclick: () => apply({}, 'Cleared') }, 'Clear overrides'),
      el('span', { class: 'result' }), message));
    return form;
  });
  container.replaceChildren(...forms);
}

/** Disable or enable one endpoint (or the provider kind that disabled it). */
function toggle(route, disabled, message) {
  let target = route.endpoint_id;
  let action = 'disable';
  let label = 'Disable';
  if (disabled.has(route.endpoint_id)) {
    [action, label] = ['enable', 'Enable'];
  } else if (disabled.has(route.provider)) {
    [target, action, label] = [route.provider, 'enable', `Enable all ${route.provider}`];
  }
  return el('button', {
    type: 'button', class: `secondary ${action}`,
    onclick: async () => {
      try {
        await call(API.provider(target, action), { method: 'POST' });
        state.weightsKey = null;
        await poll();
      } catch (e) {
        if (refused(e)) { signOut(`Signed out: ${e.message}`); return; }
        message.className = 'small error';
        message.textContent = e.detail || e.message;
      }
    },
  }, label);
}

// ---- recent requests and charts ------------------------------------------------------------

function updateModelFilter(routing) {
  const select = $('filter-model');
  const wanted = ['', ...routing.models.map((m) => m.id)];
  const have = [...select.options].map((o) => o.value);
  if (JSON.stringify(wanted) === JSON.stringify(have)) return;
  const current = select.value;
  select.replaceChildren(...wanted.map((id) => el('option', { value: id }, id || 'all')));
  select.value = wanted.includes(current) ? current : '';
}

function renderRequests(logs) {
  if (logs.status === 'rejected') {
    const e = logs.reason;
    const why = e.status === 404
      ? 'this gateway has no GET /admin/logs'
      : e.detail || e.message;
    const note = `Request log not available (${why}).`;
    $('logs-note').textContent = note;
    $('requests').replaceChildren();
    for (const id of ['chart-ttft', 'chart-latency']) {
      $(id).replaceChildren(el('p', { class: 'muted empty' }, note));
    }
    return;
  }
  const rows = logs.value.rows || [];
  $('logs-note').textContent = rows.length
    ? `${rows.length} newest${logs.value.next_before !== null ? ' (older rows exist)' : ''}`
    : 'No requests logged yet.';
  chartRows($('chart-ttft'), rows, 'ttft_ms');
  chartRows($('chart-latency'), rows, 'latency_ms');
  const body = rows.map((row) => el('tr', {
    class: row.status >= 400 ? 'failed' : row.fell_back ? 'fell-back' : '',
    dataset: { requestId: row.request_id || '' },
  },
  el('td', { class: 'nowrap' }, clock(row.created_at_ms)),
  el('td', { class: 'mono small', title: row.request_id || '' }, shortId(row.request_id)),
  el('td', {}, row.model || '–', row.route ? el('div', { class: 'muted small' }, row.route) : null,
    row.consumer ? el('div', { class: 'muted small' }, row.consumer) : null),
  el('td', {}, el('span', { class: `pill ${row.status >= 400 ? 'bad' : 'good'}` }, row.status),
    row.fell_back ? el('span', { class: 'pill warn small' }, 'fell back') : null,
    row.error ? el('div', { class: 'error small wrap' }, row.error) : null),
  el('td', {}, attempts(row)),
  el('td', { class: 'small decision' }, decision(row.decision)),
  el('td', { class: 'num' }, ms(row.ttft_ms)),
  el('td', { class: 'num' }, ms(row.latency_ms)),
  el('td', { class: 'num small' }, tokens(row)),
  el('td', { class: 'num small' }, row.cost_usd ? `$${row.cost_usd.toFixed(6)}` : '–')));
  $('requests').replaceChildren(
    head(['Time', 'Request id', 'Model', 'Status', 'Attempts', 'Routing decision',
      '#TTFT', '#Latency', '#Tokens in / out / cached', '#Cost']),
    el('tbody', {}, body));
}

function attempts(row) {
  const list = row.attempt_log || [];
  if (!list.length) {
    return el('span', { class: 'mono small' }, row.endpoint_id || '–',
      el('span', { class: 'muted' }, ` (${row.attempts ?? 0} attempt(s), no detail)`));
  }
  return el('ol', { class: 'attempts' }, list.map((a) => {
    const failure = a.error_type && a.error_type !== 'none' ? a.error_type : null;
    const ok = a.status >= 200 && a.status < 300 && !failure;
    const served = ok && row.status < 400 && a.endpoint_id === row.endpoint_id;
    return el('li', {
      class: `attempt ${ok ? 'ok' : 'failed'}${served ? ' served' : ''}`,
      title: served ? 'served the answer' : null,
      dataset: { endpoint: a.endpoint_id },
    },
      el('span', { class: 'mono' }, a.endpoint_id), ' ',
      el('span', { class: `pill small ${ok ? 'good' : 'bad'}` }, a.status ?? '–'),
      failure ? el('span', { class: 'error small' }, ` ${failure}`) : null,
      a.hedge ? el('span', { class: 'tag small' }, 'hedge') : null,
      el('span', { class: 'muted small' }, ` ${ms(a.latency_ms)}`));
  }));
}

function decision(d) {
  if (!d) return el('span', { class: 'muted' }, '–');
  return el('div', {},
    el('span', { class: 'tag' }, d.strategy), ' ',
    el('span', { class: 'mono small' }, (d.order || []).join(' → ')),
    d.seed !== null && d.seed !== undefined ? el('div', { class: 'muted small' }, `seed ${d.seed}`) : null);
}

function tokens(row) {
  const n = (v) => (v === null || v === undefined ? '–' : integer(v));
  return `${n(row.prompt_tokens)} / ${n(row.completion_tokens)} / ${n(row.cached_tokens)}`;
}

/** One chart of a figure of the log rows over time, one series per endpoint. */
function chartRows(container, rows, field) {
  const byEndpoint = new Map();
  for (const row of rows) {
    const value = row[field];
    if (value === null || value === undefined || !row.created_at_ms) continue;
    const endpoint = row.endpoint_id || 'no endpoint';
    if (!byEndpoint.has(endpoint)) byEndpoint.set(endpoint, []);
    byEndpoint.get(endpoint).push({ t: row.created_at_ms, v: value, failed: row.status >= 400 });
  }
  const series = [...byEndpoint.entries()].sort().map(([name, points]) =>
    ({ name, color: colorFor(name), points: points.sort((a, b) => a.t - b.t) }));
  lineChart(container, series);
}

function colorFor(name) {
  if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(name);
}

function lineChart(container, series) {
  const points = series.flatMap((s) => s.points);
  if (!points.length) {
    container.replaceChildren(el('p', { class: 'muted empty' }, 'No requests with this figure yet.'));
    return;
  }
  const [W, H, L, R, T, B] = [640, 220, 56, 14, 12, 26];
  let t1 = Math.max(...points.map((p) => p.t));
  let t0 = Math.min(...points.map((p) => p.t));
  if (t1 - t0 < 60000) t0 = t1 - 60000;
  const vmax = niceCeil(Math.max(...points.map((p) => p.v)) * 1.1 || 1);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / vmax) * (H - T - B);
  const grid = [];
  for (let i = 0; i <= 4; i++) {
    const v = (vmax * i) / 4;
    grid.push(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'gridline' }),
      svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, ms(v)));
  }
  for (let i = 0; i <= 3; i++) {
    const t = t0 + ((t1 - t0) * i) / 3;
    grid.push(svg('text', { x: x(t), y: H - 6, 'text-anchor': i === 0 ? 'start' : i === 3 ? 'end' : 'middle', class: 'axis' }, clock(t)));
  }
  const lines = series.map((s) => svg('g', {},
    s.points.length > 1
      ? svg('polyline', { points: s.points.map((p) => `${x(p.t)},${y(p.v)}`).join(' '), fill: 'none', stroke: s.color, 'stroke-width': 1.5, 'stroke-opacity': 0.55 })
      : null,
    s.points.map((p) => svg('circle', {
      cx: x(p.t), cy: y(p.v), r: p.failed ? 4 : 3,
      fill: p.failed ? '#fff' : s.color, stroke: s.color, 'stroke-width': p.failed ? 2 : 0,
    }, svg('title', {}, `${s.name} · ${clock(p.t)} · ${ms(p.v)}${p.failed ? ' · failed' : ''}`)))));
  const legend = el('div', { class: 'legend' }, series.map((s) =>
    el('span', {}, el('i', { class: 'swatch', dataset: { color: s.color } }), s.name)));
  for (const swatch of legend.querySelectorAll('.swatch')) swatch.style.background = swatch.dataset.color;
  container.replaceChildren(
    svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', class: 'plot' },
      svg('line', { x1: L, x2: L, y1: T, y2: H - B, class: 'axisline' }), grid, lines),
    legend);
}

// ---- small helpers -------------------------------------------------------------------------

/** A table head; a name starting with `#` heads a numeric (right-aligned) column. */
function head(names) {
  return el('thead', {}, el('tr', {}, names.map((n) =>
    (n.startsWith('#') ? el('th', { class: 'num' }, n.slice(1)) : el('th', {}, n)))));
}

/** A <details> that stays open across redraws (see replaceKeepingOpen). */
function details(key, summary, text) {
  return el('details', { dataset: { key } }, el('summary', {}, summary), el('pre', {}, text));
}

function replaceKeepingOpen(container, children) {
  const open = new Set([...container.querySelectorAll('details[open]')].map((d) => d.dataset.key));
  container.replaceChildren(...children);
  for (const d of container.querySelectorAll('details')) if (open.has(d.dataset.key)) d.open = true;
}

function niceCeil(v) {
  const step = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
  return 10 * step;
}

const pad = (n) => String(n).padStart(2, '0');
function clock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function ms(v) {
  if (v === null || v === undefined) return '–';
  return v >= 10000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`;
}
const percent = (v) => (v === null || v === undefined ? '–' : `${(v * 100).toFixed(1)} %`);
const integer = (v) => Math.round(v).toLocaleString('en-US');
const perSecond = (v) => (v === null ? '–' : v.toFixed(v >= 10 ? 0 : 2));
const shortId = (id) => (!id ? '–' : id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id);

// ---- start ---------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', signIn);
  $('logout').addEventListener('click', () => signOut('Signed out.'));
  $('pause').addEventListener('change', () => { if (!$('pause').checked) poll(); });
  $('log-filter').addEventListener('change', () => poll());
  $('log-filter').addEventListener('submit', (e) => e.preventDefault());
  if (state.token) showDashboard();
  else $('login').hidden = false;
});
