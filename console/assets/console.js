// stockctl's live sale console. Plain JavaScript, no build step: it reads
// everything through the public API (Connect's JSON protocol over fetch,
// unary calls and server streams), with the bearer token the user entered,
// kept in this tab's sessionStorage and sent only in the Authorization
// header. docs/console.md describes what it shows.
'use strict';

const TOKEN_KEY = 'stockctl.console.token';
const CALL_TIMEOUT_MS = 4000; // a call slower than this counts as trouble
const PAGE_SIZE = 50;
const SPARK_SECONDS = 60;
const RENDER_MS = 250; // updates are applied to the DOM at most this often

// ---------------------------------------------------------------- helpers

const $ = (sel) => document.querySelector(sel);

// el builds an element; text is always set as text, never parsed as HTML.
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of kids) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const num = (v) => (v === undefined || v === null || v === '' ? 0 : Number(v));
const fmt = (n) => Number(n).toLocaleString('en-US');
const fmtRate = (n) => (n >= 100 ? n.toFixed(0) : n.toFixed(1));
const clock = (t) => new Date(t).toLocaleTimeString('en-GB', { hour12: false });
const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});
function bytes(n) {
  n = num(n);
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + ' GiB';
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + ' MiB';
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + ' KiB';
  return n + ' B';
}

function bar(frac, cls = '') {
  const f = Math.max(0, Math.min(1, frac || 0));
  const fill = el('span');
  fill.style.width = `${(f * 100).toFixed(1)}%`; // CSSOM: the page's policy forbids style attributes
  return el('div', { class: 'bar ' + cls }, fill);
}

const SVG = 'http://www.w3.org/2000/svg';
function spark(values, cls) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark ' + cls);
  svg.setAttribute('viewBox', `0 0 ${SPARK_SECONDS - 1} 20`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${i},${(19 - (v / max) * 18).toFixed(2)}`).join(' ');
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('points', pts);
  svg.append(line);
  return svg;
}

// Rate keeps per-second counts for the last SPARK_SECONDS seconds.
class Rate {
  constructor() { this.buckets = new Array(SPARK_SECONDS).fill(0); this.sec = Math.floor(Date.now() / 1000); }
  roll(now = Date.now()) {
    const s = Math.floor(now / 1000);
    const gap = Math.min(SPARK_SECONDS, s - this.sec);
    for (let i = 0; i < gap; i++) { this.buckets.shift(); this.buckets.push(0); }
    if (gap > 0) this.sec = s;
  }
  add(n) { this.roll(); this.buckets[SPARK_SECONDS - 1] += n; }
  // perSec is the rate over the last 5 whole seconds.
  perSec() { this.roll(); return this.buckets.slice(-6, -1).reduce((a, b) => a + b, 0) / 5; }
  recent() { this.roll(); return this.buckets.slice(-10).reduce((a, b) => a + b, 0); }
  values() { this.roll(); return this.buckets.slice(); }
}

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(code, message, reason = '', status = 0) {
    super(message || code);
    this.code = code;
    this.reason = reason;
    this.status = status;
  }
}

function reasonOf(doc) {
  for (const d of doc?.details || []) if (d?.debug?.reason) return d.debug.reason;
  return '';
}

function errorOf(doc, status) {
  if (doc && typeof doc === 'object' && doc.code) return new ApiError(doc.code, doc.message, reasonOf(doc), status);
  return new ApiError('unavailable', `HTTP ${status}`, '', status);
}

function headers(contentType) {
  const h = { 'Content-Type': contentType, 'Connect-Protocol-Version': '1' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

// wrapFetchError turns fetch's failures into ApiErrors a person can read.
function wrapFetchError(e, signal) {
  if (e instanceof ApiError) return e;
  if (signal?.aborted && signal.reason instanceof ApiError) return signal.reason;
  if (e?.name === 'AbortError') return new ApiError('canceled', 'canceled');
  return new ApiError('unavailable', 'the API cannot be reached (' + (e?.message || e) + ')');
}

// call makes a unary call: POST /stockctl.v1.<service>/<method> with JSON.
// timeoutMs bounds the call (CALL_TIMEOUT_MS unless the call is known to
// take long, as an audit of a SKU with many orders does).
async function call(service, method, body = {}, outer, timeoutMs = CALL_TIMEOUT_MS) {
  const ctl = new AbortController();
  const abort = () => ctl.abort(outer.reason);
  outer?.addEventListener('abort', abort, { once: true });
  const slow = setTimeout(() => ctl.abort(new ApiError('deadline_exceeded', `the API did not answer within ${timeoutMs / 1000}s`)), timeoutMs);
  try {
    const h = headers('application/json');
    h['Connect-Timeout-Ms'] = String(timeoutMs);
    const res = await fetch(`/stockctl.v1.${service}/${method}`, { method: 'POST', headers: h, body: JSON.stringify(body), signal: ctl.signal, cache: 'no-store' });
    const text = await res.text();
    let doc = null;
    try { doc = JSON.parse(text); } catch { /* not JSON: a proxy's page */ }
    if (!res.ok) throw errorOf(doc, res.status);
    return doc;
  } catch (e) {
    throw wrapFetchError(e, ctl.signal);
  } finally {
    clearTimeout(slow);
    outer?.removeEventListener('abort', abort);
  }
}

// stream makes a server-streaming call with Connect's streaming protocol
// (each message framed by a flag byte and a 4-byte length) and calls
// onOpen once the server answered, then onMessage for every message. It
// returns when the stream ends normally and throws its error otherwise.
async function stream(service, method, body, signal, onOpen, onMessage) {
  const json = new TextEncoder().encode(JSON.stringify(body));
  const frame = new Uint8Array(5 + json.length);
  new DataView(frame.buffer).setUint32(1, json.length);
  frame.set(json, 5);
  const ctl = new AbortController();
  const abort = () => ctl.abort(signal.reason);
  signal.addEventListener('abort', abort, { once: true });
  const slow = setTimeout(() => ctl.abort(new ApiError('deadline_exceeded', `the API did not answer within ${CALL_TIMEOUT_MS / 1000}s`)), CALL_TIMEOUT_MS);
  try {
    const res = await fetch(`/stockctl.v1.${service}/${method}`, { method: 'POST', headers: headers('application/connect+json'), body: frame, signal: ctl.signal, cache: 'no-store' });
    clearTimeout(slow);
    if (!res.ok) {
      let doc = null;
      try { doc = JSON.parse(await res.text()); } catch { /* empty */ }
      throw errorOf(doc, res.status);
    }
    onOpen();
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      while (buf.length >= 5) {
        const flags = buf[0];
        const len = new DataView(buf.buffer, buf.byteOffset, 5).getUint32(1);
        if (buf.length < 5 + len) break;
        const doc = JSON.parse(decoder.decode(buf.subarray(5, 5 + len)));
        buf = buf.slice(5 + len);
        if (flags & 2) { // end of stream
          if (doc.error) throw errorOf(doc.error, res.status);
          return;
        }
        onMessage(doc);
      }
    }
    throw new ApiError('unavailable', 'the stream was cut');
  } catch (e) {
    throw wrapFetchError(e, ctl.signal);
  } finally {
    clearTimeout(slow);
    signal.removeEventListener('abort', abort);
  }
}

// ------------------------------------------------------- connection state

// trouble maps each running source (a poll, a stream) to its last error;
// the header says "reconnecting" while any has one.
const trouble = new Map();
let lastTroubleRender = '';

function renderConn() {
  const c = $('#conn');
  if (!signedIn) { c.dataset.state = 'idle'; c.textContent = ''; return; }
  if (trouble.size > 0) {
    const [src, err] = trouble.entries().next().value;
    c.dataset.state = 'reconnecting';
    const text = `reconnecting… (${src}: ${err.message})`;
    if (text !== lastTroubleRender) c.textContent = text;
    lastTroubleRender = text;
  } else {
    c.dataset.state = 'live';
    c.textContent = 'live';
    lastTroubleRender = '';
  }
}

function ok(src) {
  if (trouble.delete(src)) renderConn();
}

function failed(src, err) {
  if (err.code === 'unauthenticated') { signOut(err); return; }
  trouble.set(src, err);
  renderConn();
}

// Each view runs tasks: polls and streams, stopped when the view changes.
let tasks = [];

function stopTasks() {
  for (const t of tasks) t.stop();
  tasks = [];
  trouble.clear();
  renderConn();
}

// poll runs fn every intervalMs (a number, or a function that says how
// long to wait this time), backing off up to 5 s while it fails.
function poll(src, intervalMs, fn) {
  const ctl = new AbortController();
  (async () => {
    let backoff = 500;
    while (!ctl.signal.aborted) {
      try {
        await fn(ctl.signal);
        if (ctl.signal.aborted) break;
        ok(src);
        backoff = 500;
        await sleep(typeof intervalMs === 'function' ? intervalMs() : intervalMs, ctl.signal);
      } catch (e) {
        if (ctl.signal.aborted) break;
        failed(src, e);
        await sleep(backoff, ctl.signal);
        backoff = Math.min(5000, backoff * 2);
      }
    }
  })();
  tasks.push({ stop: () => { ctl.abort(); trouble.delete(src); } });
}

// follow keeps a server stream open: request(signal) gives (a promise of)
// the request of each
// (re)connection (so that it resumes from the caller's cursor), onMessage
// gets every message, onError may handle an error itself (return true: it
// is not connection trouble); either way the stream is tried again.
function follow(src, service, method, request, onMessage, onError = () => false) {
  const ctl = new AbortController();
  (async () => {
    let backoff = 500;
    while (!ctl.signal.aborted) {
      try {
        await stream(service, method, await request(ctl.signal), ctl.signal, () => { ok(src); backoff = 500; }, onMessage);
      } catch (e) {
        if (ctl.signal.aborted) break;
        if (!onError(e)) failed(src, e);
        await sleep(backoff, ctl.signal);
        backoff = Math.min(5000, backoff * 2);
      }
    }
  })();
  tasks.push({ stop: () => { ctl.abort(); trouble.delete(src); } });
}

// every runs fn every ms while the view is shown (the batched renders).
function every(ms, fn) {
  const t = setInterval(fn, ms);
  tasks.push({ stop: () => clearInterval(t) });
}

// --------------------------------------------------------------- sign-in

let signedIn = false;

function showSignIn(message) {
  signedIn = false;
  stopTasks();
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
  $('#nav').hidden = true;
  $('#signout').hidden = true;
  $('#signin').hidden = false;
  $('#signin-error').textContent = message || '';
  $('#token').focus();
}

function signInMessage(err) {
  if (err.code !== 'unauthenticated') return `Sign-in failed: ${err.message}`;
  if (err.reason === 'TOKEN_MISSING') return 'Sign-in failed: this API needs a token. Enter one of the tokens of --api-tokens.';
  return 'Sign-in failed: the API refused this token (' + (err.reason || 'unauthenticated') + '). Check it and try again.';
}

function signOut(err) {
  sessionStorage.removeItem(TOKEN_KEY);
  showSignIn(err ? signInMessage(err) : '');
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  $('#signin-error').textContent = 'Signing in…';
  try {
    await call('InspectService', 'GetCluster');
  } catch (e) {
    if (e.code === 'unauthenticated') { signOut(e); return; }
    // The API is there but failing (etcd down, restarting): the token may
    // be right; go on, and the views will say "reconnecting".
  }
  signedIn = true;
  $('#signin').hidden = true;
  $('#nav').hidden = false;
  $('#signout').hidden = false;
  $('#token').value = '';
  route();
}

// ----------------------------------------------------------------- views

const views = { overview: startOverview, sku: startSKU, locks: startLocks, cluster: startCluster };

function route() {
  if (!signedIn) return;
  stopTasks();
  const hash = location.hash.replace(/^#\/?/, '');
  let name = 'overview';
  let arg = '';
  if (hash.startsWith('sku/')) { name = 'sku'; arg = decodeURIComponent(hash.slice(4)); }
  else if (hash === 'locks') name = 'locks';
  else if (hash === 'cluster') name = 'cluster';
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + name;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === (name === 'sku' ? 'overview' : name));
  document.body.dataset.view = name;
  renderConn();
  views[name](arg);
}

// ---- the sale overview

// The overview's state outlives its view, so that coming back keeps the
// SKUs and the rates seen so far.
const ov = {
  skus: new Map(), // name → row state
  page: 0,
  filter: '',
  sort: 'activity',
  cursor: 0, // the order feed's cursor
  listed: null, // true: ListSKUs exists; false: it does not (fallback)
  counts: new Map(), // a server's start of counting → (sku → refused) of its last GetOrderCounts
  dirty: true,
};

function skuState(name) {
  let s = ov.skus.get(name);
  if (!s) {
    s = { name, status: null, orders: new Rate(), refusals: new Rate(), lastOrderAt: 0, soldOutAt: 0 };
    ov.skus.set(name, s);
    ov.dirty = true;
  }
  return s;
}

async function listSKUs(signal) {
  if (ov.listed === false) return;
  const names = [];
  let pageToken = '';
  do {
    let res;
    try {
      res = await call('StockService', 'ListSKUs', { pageSize: 1000, pageToken }, signal);
    } catch (e) {
      if (e.code === 'unimplemented' || e.status === 404) { ov.listed = false; return; }
      throw e;
    }
    for (const s of res.skus || []) names.push(typeof s === 'string' ? s : s.sku);
    pageToken = res.nextPageToken || '';
  } while (pageToken);
  ov.listed = true;
  for (const n of names) skuState(n);
}

function onOrders(msg) {
  for (const ev of msg.events || []) {
    const s = skuState(ev.sku);
    if (num(ev.version) === 1) {
      s.orders.add(1);
      s.lastOrderAt = Math.max(s.lastOrderAt, Date.parse(ev.createTime) || Date.now());
    }
  }
  if (num(msg.cursor) > 0) ov.cursor = num(msg.cursor);
  ov.dirty = true;
}

async function startFeedCursor(signal) {
  if (ov.cursor > 0) return;
  const c = await call('InspectService', 'GetCluster', {}, signal);
  ov.cursor = num(c.revision);
}

function orderFeedError(e) {
  // A cursor etcd has compacted past (or from another etcd): start again
  // from now; the rates miss the gap.
  if (e.reason === 'CURSOR_COMPACTED' || e.reason === 'CURSOR_AHEAD') { ov.cursor = 0; }
  return false;
}

async function pollCounts(signal) {
  const res = await call('InspectService', 'GetOrderCounts', {}, signal);
  // Each server counts from its start (res.since, which tells servers
  // apart): a delta is taken against the same server's last answer, so
  // that polls spread over several servers by a load balancer add up their
  // refusals, and a restarted server starts a new baseline.
  let last = ov.counts.get(res.since);
  const fresh = !last;
  if (fresh) {
    last = new Map();
    ov.counts.set(res.since, last);
    if (ov.counts.size > 32) ov.counts.delete(ov.counts.keys().next().value);
  }
  for (const c of res.skus || []) {
    const s = skuState(c.sku);
    const refused = num(c.refused);
    // A SKU this server counts for the first time since its last answer
    // was refused in between.
    const prev = last.get(c.sku) ?? (fresh ? refused : 0);
    if (refused > prev) s.refusals.add(refused - prev);
    last.set(c.sku, refused);
  }
  ov.dirty = true;
}

function visibleSKUs() {
  const f = ov.filter.toLowerCase();
  const list = [...ov.skus.values()].filter((s) => !f || s.name.toLowerCase().includes(f));
  const act = (s) => s.orders.recent() + s.refusals.recent();
  const by = {
    name: (a, b) => a.name.localeCompare(b.name),
    remaining: (a, b) => num(b.status?.remaining) - num(a.status?.remaining) || a.name.localeCompare(b.name),
    activity: (a, b) => act(b) - act(a) || (b.lastOrderAt - a.lastOrderAt) || a.name.localeCompare(b.name),
  }[ov.sort];
  list.sort(by);
  return list;
}

// pageSKUs is the SKUs of the page shown: their Status is polled.
function pageSKUs() {
  const list = visibleSKUs();
  const pages = Math.max(1, Math.ceil(list.length / PAGE_SIZE));
  ov.page = Math.min(ov.page, pages - 1);
  return { list, pages, rows: list.slice(ov.page * PAGE_SIZE, (ov.page + 1) * PAGE_SIZE) };
}

async function pollStatuses(signal) {
  if (ov.listed === null) await listSKUs(signal);
  const { rows } = pageSKUs();
  const queue = rows.map((s) => s.name);
  const worker = async () => {
    while (queue.length > 0 && !signal.aborted) {
      const name = queue.shift();
      try {
        const res = await call('StockService', 'Status', { sku: name }, signal);
        setStatus(skuState(name), res.status);
      } catch (e) {
        if (e.reason === 'SKU_NOT_FOUND') { ov.skus.delete(name); ov.dirty = true; continue; }
        throw e;
      }
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
}

function setStatus(s, st) {
  const was = s.status;
  s.status = st;
  const remaining = num(st.remaining);
  if (remaining === 0 && (!was || num(was.remaining) !== 0 || !s.soldOutAt)) {
    // Sold out: when its last order was placed, as the feed saw it, or
    // now if the console saw none.
    s.soldOutAt = s.lastOrderAt || Date.now();
  }
  if (remaining > 0) s.soldOutAt = 0;
  ov.dirty = true;
}

function renderOverview(force) {
  if (!ov.dirty && !force) return;
  ov.dirty = false;
  const { list, pages, rows } = pageSKUs();
  $('#ov-count').textContent = `${fmt(list.length)} SKU${list.length === 1 ? '' : 's'}` + (ov.filter ? ` matching “${ov.filter}”` : '');
  $('#ov-page').textContent = `page ${ov.page + 1} of ${pages}`;
  $('#ov-prev').disabled = ov.page === 0;
  $('#ov-next').disabled = ov.page >= pages - 1;
  $('#ov-note').textContent = ov.listed === false
    ? 'This server has no ListSKUs: the list holds the SKUs with orders since the console opened, or orders through this server since it started.'
    : '';
  const body = $('#ov-rows');
  const out = rows.map((s) => {
    const st = s.status;
    const total = num(st?.total);
    const remaining = num(st?.remaining);
    const reserved = num(st?.reserved);
    const sold = num(st?.allocated) - reserved;
    let state;
    if (!st) state = el('td', { class: 'state', text: '…' });
    else if (remaining === 0) state = el('td', { class: 'state state-soldout', text: 'sold out ' + clock(s.soldOutAt) });
    else if (s.orders.recent() > 0) state = el('td', { class: 'state state-selling', text: 'selling' });
    else state = el('td', { class: 'state state-idle', text: 'idle' });
    const refusals = s.refusals.values();
    const tr = el('tr', { 'data-sku': s.name, 'data-soldout': st && remaining === 0 ? 'true' : 'false', 'data-refusals': String(refusals.reduce((a, b) => a + b, 0)) },
      el('td', { class: 'name' }, el('a', { href: '#/sku/' + encodeURIComponent(s.name), text: s.name })),
      el('td', { class: 'num sold', text: st ? fmt(sold) : '' }),
      el('td', { class: 'num reserved', text: st ? fmt(reserved) : '' }),
      el('td', { class: 'num remaining', text: st ? fmt(remaining) : '' }),
      el('td', {}, bar(total ? remaining / total : 0)),
      el('td', {}, spark(s.orders.values(), 'orders'), el('span', { class: 'spark-n orders-rate', text: fmtRate(s.orders.perSec()) })),
      el('td', {}, spark(refusals, 'refusals'), el('span', { class: 'spark-n refusals-rate', text: fmtRate(s.refusals.perSec()) })),
      state);
    tr.addEventListener('click', (e) => { if (e.target.tagName !== 'A') location.hash = '#/sku/' + encodeURIComponent(s.name); });
    return tr;
  });
  body.replaceChildren(...out);
  if (rows.length === 0) body.append(el('tr', {}, el('td', { colSpan: 8, class: 'muted', text: 'no SKU yet' })));
}

function startOverview() {
  ov.dirty = true;
  follow('order feed', 'StockService', 'WatchOrders', async (signal) => {
    await startFeedCursor(signal);
    return { sku: '', since: String(ov.cursor) };
  }, onOrders, orderFeedError);
  // The feed starts now (the rates start when the console opens), and
  // again from now if etcd compacted past its cursor.
  poll('stock', 1000, pollStatuses);
  poll('SKU list', 5000, async (signal) => { if (ov.listed !== false) await listSKUs(signal); });
  poll('order counts', 1000, pollCounts);
  // Rates decay while nothing happens: render at least every second.
  let ticks = 0;
  every(RENDER_MS, () => renderOverview(++ticks % 4 === 0));
}

// ---- one SKU

function startSKU(name) {
  $('#sku-title').textContent = name;
  const sku = { status: null, full: 1, holders: new Map(), refills: [], orders: [], cursor: 0, pass: null, dirty: true, lastAudit: null };
  for (const sel of ['#sku-cards', '#sku-segs', '#sku-refills', '#sku-orders']) $(sel).replaceChildren();
  $('#sku-rev').textContent = '';
  $('#sku-scale').textContent = '';
  $('#sku-audit').textContent = 'auditing…';
  $('#sku-audit').className = 'audit';

  // A SKU that does not exist (yet, or any more) is not connection
  // trouble: the view says so and keeps trying.
  const missing = (e) => {
    if (e.reason !== 'SKU_NOT_FOUND') return false;
    sku.missing = true;
    $('#sku-rev').textContent = 'no such SKU (not created yet, or deleted)';
    return true;
  };
  follow('status', 'StockService', 'WatchStatus', () => ({ sku: name, minInterval: '0.2s' }), (msg) => {
    sku.missing = false;
    const st = msg.status;
    const prev = sku.status;
    if (prev && num(st.revision) > num(prev.revision)) {
      for (const seg of st.segments || []) {
        const was = (prev.segments || [])[seg.index];
        if (was && num(seg.inbox) > num(was.inbox)) {
          sku.refills.unshift({ at: Date.now(), text: `seg/${seg.index} +${fmt(num(seg.inbox) - num(was.inbox))} into its inbox (revision ${st.revision})` });
        }
      }
      const p = st.rebalancer;
      if (p && (!sku.pass || num(p.revision) > num(sku.pass.revision)) && num(p.moves) > 0) {
        sku.refills.unshift({ at: Date.now(), text: `rebalancer ${p.leader}'s pass (every SKU): ${p.moves} move${p.moves === 1 ? '' : 's'} (${fmt(num(p.moved))} units)` });
      }
      sku.refills.length = Math.min(sku.refills.length, 100);
    }
    if (st.rebalancer) sku.pass = st.rebalancer;
    sku.status = st;
    for (const seg of st.segments || []) sku.full = Math.max(sku.full, num(seg.remaining));
    sku.dirty = true;
  }, missing);
  follow('orders', 'StockService', 'WatchOrders', async (signal) => {
    // Resume from the cursor; the first connection starts now.
    if (!sku.cursor) sku.cursor = num((await call('StockService', 'Status', { sku: name }, signal)).status.revision);
    return { sku: name, since: String(sku.cursor) };
  }, (msg) => {
    for (const ev of msg.events || []) {
      sku.orders.unshift(ev);
    }
    sku.orders.length = Math.min(sku.orders.length, 200);
    if (num(msg.cursor) > 0) sku.cursor = num(msg.cursor);
    sku.dirty = true;
  }, (e) => {
    if (e.reason === 'CURSOR_COMPACTED' || e.reason === 'CURSOR_AHEAD') { sku.cursor = 0; }
    return missing(e);
  });
  poll('holders', 1000, async (signal) => {
    const res = await call('InspectService', 'ListPlaceHolders', { sku: name }, signal);
    sku.holders = new Map((res.places || []).map((p) => [p.index, p]));
    sku.dirty = true;
  });
  // An audit reads every order record of the SKU: every 3 s, or ten times
  // as long as the last one took, so that a large SKU's audits take at
  // most a tenth of the server's time for this view.
  let auditMs = 0;
  poll('audit', () => Math.max(3000, 10 * auditMs), async (signal) => {
    const t0 = performance.now();
    try {
      sku.lastAudit = await call('StockService', 'Audit', { sku: name }, signal, 60000);
    } catch (e) {
      if (!missing(e)) throw e;
    }
    auditMs = performance.now() - t0;
    sku.dirty = true;
  });
  every(RENDER_MS, () => { if (sku.dirty) { sku.dirty = false; renderSKU(sku); } });
}

function holderText(h) {
  if (!h) return '';
  let t = (h.identity || '?') + ' ' + h.lease;
  if (h.rebalancer) t += ' (rebalancer)';
  if (h.waiting > 0) t += ` +${h.waiting} waiting`;
  return t;
}

function renderSKU(sku) {
  const st = sku.status;
  if (st) {
    const reserved = num(st.reserved);
    const cards = [
      ['total', fmt(num(st.total))], ['remaining', fmt(num(st.remaining))], ['sold', fmt(num(st.allocated) - reserved)],
      ['reserved', fmt(reserved)], ['pool', fmt(num(st.pool))], ['orders', fmt(num(st.orders))],
      ['refill', `${fmt(num(st.refillBatch))} below ${fmt(num(st.lowWatermark))}`],
    ];
    $('#sku-cards').replaceChildren(...cards.map(([k, v]) => el('div', { class: 'card', 'data-k': k }, el('div', { class: 'k', text: k }), el('div', { class: 'v', text: v }))));
    $('#sku-rev').textContent = `revision ${st.revision}` + (num(st.remaining) === 0 ? ' · sold out' : '');
    const low = num(st.lowWatermark);
    const rows = [el('tr', { 'data-place': 'pool' },
      el('td', { text: 'pool' }), el('td', { class: 'num', text: fmt(num(st.pool)) }), el('td'),
      el('td', {}, bar(num(st.total) ? num(st.pool) / num(st.total) : 0, 'pool')),
      el('td', { class: 'holder', text: holderText(sku.holders.get(-1)) }))];
    for (const seg of st.segments || []) {
      const r = num(seg.remaining);
      rows.push(el('tr', { 'data-place': 'seg/' + seg.index },
        el('td', { text: 'seg/' + seg.index }), el('td', { class: 'num', text: fmt(r) }), el('td', { class: 'num', text: fmt(num(seg.inbox)) }),
        el('td', {}, bar(r / sku.full, r < low ? 'low' : ''), r < low ? el('span', { class: 'low-tag', text: 'low' }) : null),
        el('td', { class: 'holder', text: holderText(sku.holders.get(seg.index)) })));
    }
    $('#sku-segs').replaceChildren(...rows);
    $('#sku-scale').textContent = `segment bars: full at ${fmt(sku.full)} units, the most a segment held since this view opened; the pool's bar is full at the total`;
  }
  const a = sku.lastAudit;
  if (a) {
    const p = $('#sku-audit');
    if (a.ok) {
      p.className = 'audit ok';
      p.textContent = `✓ the books balance at revision ${a.revision}: total ${fmt(num(a.total))} = pool ${fmt(num(a.pool))} + segments ${fmt(num(a.segments))} + allocated ${fmt(num(a.allocated))} (${fmt(num(a.confirmed))} sold, ${fmt(num(a.reserved))} reserved) in ${fmt(num(a.orders))} orders`;
    } else {
      p.className = 'audit bad';
      p.textContent = `✗ the books do not balance at revision ${a.revision}: ` + (a.problems || []).join('; ');
    }
  }
  $('#sku-refills').replaceChildren(...sku.refills.slice(0, 50).map((r) => el('li', { text: `${clock(r.at)}  ${r.text}` })));
  $('#sku-orders').replaceChildren(...sku.orders.slice(0, 100).map((ev) => el('li', {
    text: `${ev.createTime ? clock(Date.parse(ev.createTime)) : ''}  r${ev.revision}  ${ev.event.replace('ORDER_EVENT_KIND_', '').toLowerCase().padEnd(9)}  ${ev.order}  ×${ev.qty}  ${(ev.parts || []).map((p) => p.place + ':' + p.qty).join(' ')}${ev.buyer ? '  buyer ' + ev.buyer : ''}`,
  })));
  if (sku.orders.length === 0) $('#sku-orders').append(el('li', { class: 'muted', text: 'no order since this view opened' }));
  if (sku.refills.length === 0) $('#sku-refills').append(el('li', { class: 'muted', text: 'no refill since this view opened' }));
}

// ---- locks and semaphores

function startLocks() {
  let last = null;
  poll('locks', 1000, async (signal) => {
    last = await call('InspectService', 'ListLocks', {}, signal);
    renderLocks(last);
  });
}

function renderLocks(res) {
  $('#locks-rev').textContent = `at revision ${res.revision}`;
  const rows = [];
  for (const l of res.locks || []) {
    const type = l.semaphore ? `semaphore/${l.limit}` : 'lock';
    const row = (k, state) => el('tr', { 'data-lock': l.name, 'data-state': state.startsWith('holds') ? 'holds' : 'waits' },
      el('td', { class: 'name', text: l.name }), el('td', { text: type }), el('td', { class: 'state', text: state }),
      el('td', { text: (k.kind || '').replace('LOCK_KIND_', '').toLowerCase() }),
      el('td', { class: 'identity', text: k.identity || (l.semaphore ? '(semaphores carry no identity)' : '') }),
      el('td', { class: 'lease', text: k.lease }), el('td', { class: 'num token', text: k.token }),
      el('td', { class: 'num', text: k.revision }));
    for (const k of l.holders || []) rows.push(row(k, 'holds'));
    (l.waiters || []).forEach((k, i) => rows.push(row(k, `waits (${i + 1})`)));
  }
  $('#locks-rows').replaceChildren(...rows);
  $('#locks-note').textContent = rows.length === 0 ? 'no lock or semaphore is held or awaited' :
    'One row per process key: the goroutines of a process that share a key, or queue behind it, do not show. Token: the fencing token of the key\'s first hold.';
}

// ---- the cluster

function startCluster() {
  poll('cluster', 2000, async (signal) => renderCluster(await call('InspectService', 'GetCluster', {}, signal)));
}

function renderCluster(c) {
  $('#cluster-time').textContent = 'as of ' + clock(Date.parse(c.time) || Date.now());
  const cards = [
    ['revision', fmt(num(c.revision))],
    ['compacted before', fmt(num(c.compactRevision))],
    ['rebalancer', c.rebalancerIdentity ? `${c.rebalancerIdentity} (${c.rebalancerLease})` : 'none elected'],
    ['prefix', c.prefix],
  ];
  $('#cluster-cards').replaceChildren(...cards.map(([k, v]) => el('div', { class: 'card', 'data-k': k }, el('div', { class: 'k', text: k }), el('div', { class: 'v', text: v }))));
  $('#cluster-members').replaceChildren(...(c.members || []).map((m) => el('tr', { 'data-member': m.name },
    el('td', { text: m.id }), el('td', { text: m.name }), el('td', { text: (m.clientUrls || []).join(', ') }),
    el('td', { text: m.leader ? 'leader' : m.learner ? 'learner' : 'follower' }))));
  $('#cluster-endpoints').replaceChildren(...(c.endpoints || []).map((e) => {
    if (e.error) return el('tr', {}, el('td', { text: e.endpoint }), el('td', { colSpan: 6, class: 'error', text: e.error }));
    const quota = num(e.quota);
    const frac = quota ? num(e.dbSize) / quota : 0;
    return el('tr', {}, el('td', { text: e.endpoint }), el('td', { text: e.version }),
      el('td', { class: 'num', text: bytes(e.dbSize) }), el('td', { class: 'num', text: bytes(e.dbSizeInUse) }),
      el('td', { class: 'num', text: quota ? bytes(quota) : 'not reported' }),
      el('td', {}, bar(frac, frac >= 0.8 ? 'full-alarm' : ''), el('span', { class: 'muted', text: quota ? ` ${(frac * 100).toFixed(1)}%` : '' })),
      el('td', { class: (e.alarms || []).length ? 'error' : '', text: (e.alarms || []).join(', ') || 'none' }));
  }));
}

// ------------------------------------------------------------------ start

$('#signin-form').addEventListener('submit', (e) => { e.preventDefault(); signIn($('#token').value.trim()); });
$('#signout').addEventListener('click', () => signOut());
$('#ov-filter').addEventListener('input', (e) => { ov.filter = e.target.value.trim(); ov.page = 0; renderOverview(true); });
$('#ov-sort').addEventListener('change', (e) => { ov.sort = e.target.value; renderOverview(true); });
$('#ov-prev').addEventListener('click', () => { ov.page = Math.max(0, ov.page - 1); renderOverview(true); });
$('#ov-next').addEventListener('click', () => { ov.page += 1; renderOverview(true); });
window.addEventListener('hashchange', route);

const stored = sessionStorage.getItem(TOKEN_KEY);
if (stored !== null) signIn(stored);
else showSignIn('');
