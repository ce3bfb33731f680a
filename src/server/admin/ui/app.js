// divvy's dashboard: reads /api/v1/ every 2 s and draws the current view.
// Vanilla JS, no dependency; tokens live in this tab's sessionStorage only.
'use strict';

const REFRESH_MS = 2000;
const PAGE = 50;
const state = { view: 'overview', rule: null, filter: '', sort: 'name', order: 'asc', offset: 0, window: '5m', busy: false, needsToken: false };
window.__errors = window.__errors || [];
window.addEventListener('error', (e) => window.__errors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => window.__errors.push(String(e.reason)));
document.addEventListener('securitypolicyviolation', (e) => window.__errors.push('CSP: ' + e.violatedDirective + ' ' + e.blockedURI));

const $ = (id) => document.getElementById(id);
const token = () => sessionStorage.getItem('divvy.token') || '';
const adminToken = () => sessionStorage.getItem('divvy.adminToken') || '';

class NeedToken extends Error {}

async function api(path) {
  const headers = {};
  if (token()) headers.Authorization = 'Bearer ' + token();
  const r = await fetch(path, { headers, cache: 'no-store' });
  if (r.status === 401 || r.status === 403) {
    const body = await r.json().catch(() => ({}));
    throw new NeedToken(body.error || ('HTTP ' + r.status));
  }
  if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
  return r.json();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k === 'text') e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

const fmt = (n) => (n >= 100 ? Math.round(n).toString() : (Math.round(n * 10) / 10).toString());
const pct = (x) => (Math.round(x * 1000) / 10) + '%';
const actorText = (a) => (a === '' ? '(whole rule)' : a);

// A chart of allowed (green) and denied (red) per second on a canvas.
function drawChart(canvas, series) {
  const ctx = canvas.getContext('2d');
  const w = canvas.width, h = canvas.height, pad = 34;
  ctx.clearRect(0, 0, w, h);
  const a = series.allowed, d = series.denied, n = Math.max(a.length, 1);
  const max = Math.max(1, ...a, ...d);
  ctx.strokeStyle = '#dde2e8'; ctx.fillStyle = '#6b7683'; ctx.font = '11px sans-serif';
  for (let i = 0; i <= 4; i++) {
    const y = pad / 2 + (h - pad) * i / 4;
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(fmt(max * (4 - i) / 4), 2, y + 4);
  }
  ['-15m', '-10m', '-5m', 'now'].forEach((t, i) => ctx.fillText(t, pad + (w - pad - 30) * i / 3, h - 4));
  const line = (vals, color) => {
    ctx.strokeStyle = color; ctx.fillStyle = color + '33'; ctx.lineWidth = 1.5;
    ctx.beginPath();
    vals.forEach((v, i) => {
      const x = pad + (w - pad - 4) * i / (n - 1 || 1), y = pad / 2 + (h - pad) * (1 - v / max);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    ctx.lineTo(w - 4, h - pad / 2); ctx.lineTo(pad, h - pad / 2); ctx.closePath(); ctx.fill();
  };
  line(a, '#2e9b4f'); line(d, '#d2393b');
}

// A sparkline as inline SVG (cheap for 50 rows).
function sparkline(history) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', '180'); svg.setAttribute('height', '24'); svg.setAttribute('class', 'spark');
  if (!history) return svg;
  const max = Math.max(1, ...history.allowed, ...history.denied), n = history.allowed.length;
  for (const [vals, color] of [[history.allowed, '#2e9b4f'], [history.denied, '#d2393b']]) {
    const p = document.createElementNS(ns, 'polyline');
    p.setAttribute('points', vals.map((v, i) => (180 * i / (n - 1 || 1)).toFixed(1) + ',' + (23 - 22 * v / max).toFixed(1)).join(' '));
    p.setAttribute('fill', 'none'); p.setAttribute('stroke', color); p.setAttribute('stroke-width', '1');
    svg.append(p);
  }
  return svg;
}

function fillOffenders(tbody, list, withRule) {
  tbody.replaceChildren(...list.map((o, i) => el('tr', { 'data-actor': o.actor },
    ...(withRule === 'rank' ? [el('td', { text: String(i + 1) })] : []),
    ...(withRule ? [el('td', { class: 'name', text: o.rule })] : []),
    el('td', { class: 'actor', text: actorText(o.actor) }),
    el('td', { class: 'num count', text: String(o.count) }),
    ...(withRule === 'rank' ? [el('td', { class: 'num', text: String(o.error) })] : []))));
  if (!list.length) tbody.replaceChildren(el('tr', {}, el('td', { class: 'muted', text: 'no denied hits' })));
}

async function showOverview() {
  const o = await api('/api/v1/overview');
  $('ov-allowed').textContent = fmt(o.allowedPerSecond);
  $('ov-denied').textContent = fmt(o.deniedPerSecond);
  $('ov-p99').textContent = o.p99DecisionSeconds == null ? '–' : fmt(o.p99DecisionSeconds * 1e6) + ' µs';
  const st = o.store;
  $('ov-store').textContent = st.name + (st.up ? ' · up' : ' · failing') + (st.acting ? ' · policy ' + st.acting + ' acting' : '');
  $('ov-store').className = 'v ' + (st.up ? 'ok' : 'bad');
  drawChart($('ov-chart'), o.series);
  fillOffenders($('ov-offenders').tBodies[0], o.offenders, true);
  const p = o.policy;
  const loaded = p.loadedAt ? new Date(p.loadedAt * 1000).toISOString() : '–';
  const rows = [['hash', p.hash || '–'], ['source', p.source || '–'], ['rules', String(p.rules)], ['domains', p.domains.join(', ') || '–'],
    ['last reload', loaded], ['reloads', p.reloads.succeeded + ' ok, ' + p.reloads.failed + ' failed'], ['last error', p.lastError || 'none']];
  $('ov-policy').replaceChildren(...rows.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })]));
  $('nav-more').hidden = !(o.configured.global || o.configured.governors || o.configured.rlqsStreams > 0);
}

function limitCell(r) {
  const td = el('td', { class: 'limit', text: r.limit || '–' });
  if (r.knob) td.append(' ', el('span', { class: 'knob', title: 'a knob overrides the rule', text: 'knob' }));
  if (r.matchPolicy === 'shadow') td.append(' ', el('span', { class: 'knob shadow', title: 'shadow rule: counts would-be denials, never denies', text: 'shadow' }));
  return td;
}

async function showRules() {
  const q = new URLSearchParams({ filter: state.filter, sort: state.sort, order: state.order, offset: state.offset, limit: PAGE, points: 90 });
  const started = performance.now();
  const data = await api('/api/v1/rules?' + q);
  const rows = data.rules.map((r) => el('tr', { 'data-name': r.name },
    el('td', { class: 'name' }, el('a', { href: '#rule/' + encodeURIComponent(r.name), text: r.name })),
    limitCell(r), el('td', { text: r.algorithm || r.kind }),
    el('td', { class: 'num allowed', text: fmt(r.allowedPerSecond) }),
    el('td', { class: 'num denied', text: fmt(r.deniedPerSecond) }),
    el('td', { class: 'num', text: pct(r.deniedShare) }),
    el('td', {}, sparkline(r.history))));
  $('rules-table').tBodies[0].replaceChildren(...rows);
  const last = Math.min(data.offset + PAGE, data.matched);
  $('rules-count').textContent = (data.matched ? data.offset + 1 : 0) + '–' + last + ' of ' + data.matched + ' (' + data.total + ' rules)';
  $('rules-table').dataset.loadedMs = String(Math.round(performance.now() - started));
}

async function showRule() {
  const r = await api('/api/v1/rules/' + encodeURIComponent(state.rule));
  $('rule-name').textContent = r.name;
  $('rule-limit').textContent = 'limit ' + (r.limit || '–') + (r.knob ? ' (knob)' : '') + ' · ' + fmt(r.allowedPerSecond) + ' allowed/s · ' + fmt(r.deniedPerSecond) + ' denied/s'
    + (r.matchPolicy === 'shadow' ? ' · shadow: ' + r.shadowDenials + ' hits would have been denied (none was)' : '');
  drawChart($('rule-chart'), r.history || { allowed: [0], denied: [0] });
  for (const w of ['1m', '5m', '15m']) fillOffenders($('rule-offenders-' + w).tBodies[0], r.offenders[w], false);
  $('rule-knob-link').href = '#knobs/' + encodeURIComponent(r.label || '');
  showFair(r.fair);
  showDebts(r.overdraft);
}

function showDebts(d) {
  $('rule-debts').hidden = !d;
  if (!d) return;
  $('rule-debts-summary').textContent = fmt(d.chargedPastLeft) + ' credits charged past what was left since start; the counters last overdrawn:';
  const num = (x) => (typeof x === 'number' ? x : '–');
  const rows = d.counters.map((c) => el('tr', {},
    el('td', { class: 'name', text: c.counterKey }),
    el('td', { class: 'num denied', text: String(num(c.debt)) }),
    el('td', { class: 'num', text: typeof c.fullInSeconds === 'number' ? fmt(c.fullInSeconds) + ' s' : '–' })));
  $('rule-debts-table').tBodies[0].replaceChildren(...rows);
}

function showFair(f) {
  $('rule-fair').hidden = !f;
  if (!f) return;
  $('rule-fair-summary').textContent = f.active + ' active values over ' + f.counters.length + ' counters' + (f.pages > 1 ? ' (first ' + f.values.length + ' shown; GET /fair?rule=… pages the rest)' : '');
  const rows = f.values.map((v) => el('tr', {},
    el('td', { class: 'name', text: v.value }),
    el('td', { class: 'num', text: fmt(v.demandRate) }),
    el('td', { class: 'num', text: fmt(v.shareRate) }),
    el('td', { class: 'num allowed', text: fmt(v.admittedRate) }),
    el('td', { text: v.counter })));
  $('rule-fair-table').tBodies[0].replaceChildren(...rows);
}

async function showOffenders() {
  const o = await api('/api/v1/offenders?window=' + state.window);
  fillOffenders($('offenders-table').tBodies[0], o.offenders, 'rank');
}

async function showKnobs() {
  const k = await api('/api/v1/knobs');
  const rows = k.knobs.map((x) => el('tr', { 'data-label': x.label },
    el('td', { text: x.label }),
    el('td', { text: Object.entries(x.set).filter(([, v]) => v != null).map(([a, v]) => a + '=' + v).join(' ') }),
    el('td', { text: x.expiresInSeconds == null ? 'until removed' : Math.round(x.expiresInSeconds) + ' s' }),
    el('td', { text: x.setBy }),
    el('td', {}, el('button', { type: 'button', 'data-remove': x.label, text: 'remove' }))));
  if (!rows.length) rows.push(el('tr', {}, el('td', { class: 'muted', text: 'no knob is set' })));
  $('knobs-table').tBodies[0].replaceChildren(...rows);
}

// Each governor's setpoint, measurement and output as seen by this page
// since it opened (the server keeps no governor history): 450 points, 15 min.
const govHistory = new Map();

function drawGovernor(canvas, points) {
  const load = { allowed: points.map((p) => p.measurement ?? 0), denied: points.map((p) => p.setpoint) };
  drawChart(canvas, load);
}

function renderGovernors(gov) {
  const cards = (gov.governors || []).map((g) => {
    const h = govHistory.get(g.rule) || [];
    h.push({ setpoint: g.setpoint, measurement: g.measurement, output: g.output });
    if (h.length > 450) h.shift();
    govHistory.set(g.rule, h);
    const canvas = el('canvas', { width: '640', height: '140', class: 'governor-chart' });
    drawGovernor(canvas, h);
    const outputs = { allowed: h.map((p) => p.output ?? 0), denied: h.map(() => 0) };
    return el('div', { class: 'governor', 'data-rule': g.rule },
      el('h3', { text: g.rule + ' · ' + g.role + (g.breakerOpen ? ' · breaker open' : ' · breaker closed') }),
      el('p', { class: 'muted', text: 'measurement ' + (g.measurement ?? '–') + ' against setpoint ' + g.setpoint + ' (green: measurement, red: setpoint); output creditLimit ' + (g.output ?? '–') + (g.lastError ? ' · last error: ' + g.lastError : '') }),
      canvas, el('div', {}, 'output over time ', sparkline(outputs)));
  });
  if (!cards.length) cards.push(el('p', { class: 'muted', text: 'no governor in the policy' }));
  $('more-governors').replaceChildren(...cards);
}
window.divvyRenderGovernors = renderGovernors;

async function showMore() {
  const [g, r, gov] = await Promise.all([api('/api/v1/global'), api('/api/v1/rlqs'), api('/api/v1/governors')]);
  $('more-global').textContent = JSON.stringify(g, null, 2);
  $('more-rlqs').textContent = JSON.stringify(r, null, 2);
  renderGovernors(gov);
}

const VIEWS = { overview: showOverview, rules: showRules, rule: showRule, offenders: showOffenders, knobs: showKnobs, more: showMore };

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    await VIEWS[state.view]();
    $('token-prompt').hidden = true;
    $('status').textContent = 'updated ' + new Date().toLocaleTimeString();
    document.body.dataset.ready = '1';
  } catch (e) {
    if (e instanceof NeedToken) {
      $('token-prompt').hidden = false;
      $('token-error').textContent = token() ? e.message : '';
      $('status').textContent = 'token needed';
      document.body.dataset.ready = 'token';
    } else {
      $('status').textContent = 'error: ' + e.message;
    }
  } finally {
    state.busy = false;
  }
}

function route() {
  const [view, arg] = (location.hash.slice(1) || 'overview').split('/');
  state.view = VIEWS[view] ? view : 'overview';
  if (view === 'rule') state.rule = decodeURIComponent(arg || '');
  if (view === 'knobs' && arg) $('knob-label').value = decodeURIComponent(arg);
  for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== 'view-' + state.view;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === state.view || (state.view === 'rule' && a.dataset.view === 'rules'));
  refresh();
}

async function changeKnob(method, label, body) {
  const status = $('knob-status');
  status.className = ''; status.textContent = method === 'PUT' ? 'setting…' : 'removing…';
  const headers = { 'Content-Type': 'application/json' };
  if (adminToken()) headers.Authorization = 'Bearer ' + adminToken();
  const r = await fetch('/knobs/' + encodeURIComponent(label), { method, headers, body: body ? JSON.stringify(body) : undefined });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) {
    status.className = 'error';
    status.textContent = 'refused (HTTP ' + r.status + '): ' + (answer.error || r.statusText);
    return;
  }
  status.className = 'ok';
  status.textContent = method === 'PUT' ? 'knob set on ' + label + ': ' + ((answer.effective && answer.effective.describe) || '') : 'knob on ' + label + ' removed';
  refresh();
}

function knobBody() {
  const body = {};
  for (const [id, field] of [['knob-credit', 'creditLimit'], ['knob-reset', 'resetSeconds'], ['knob-ttl', 'ttlSeconds']]) {
    const v = $(id).value.trim();
    if (v !== '') body[field] = Number(v);
  }
  return body;
}

function wire() {
  window.addEventListener('hashchange', route);
  $('read-token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem('divvy.token', $('read-token').value.trim());
    refresh();
  });
  $('admin-token').value = adminToken();
  $('admin-token').addEventListener('change', () => sessionStorage.setItem('divvy.adminToken', $('admin-token').value.trim()));
  $('knob-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem('divvy.adminToken', $('admin-token').value.trim());
    changeKnob('PUT', $('knob-label').value.trim(), knobBody()).catch((x) => { $('knob-status').textContent = String(x); });
  });
  $('knob-remove').addEventListener('click', () => {
    sessionStorage.setItem('divvy.adminToken', $('admin-token').value.trim());
    changeKnob('DELETE', $('knob-label').value.trim()).catch((x) => { $('knob-status').textContent = String(x); });
  });
  $('knobs-table').addEventListener('click', (e) => {
    const label = e.target.dataset && e.target.dataset.remove;
    if (label) { sessionStorage.setItem('divvy.adminToken', $('admin-token').value.trim()); changeKnob('DELETE', label); }
  });
  let typing;
  $('rules-filter').addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.filter = $('rules-filter').value; state.offset = 0; refresh(); }, 150);
  });
  $('rules-table').tHead.addEventListener('click', (e) => {
    const s = e.target.dataset && e.target.dataset.sort;
    if (!s) return;
    state.order = state.sort === s && state.order === 'desc' ? 'asc' : (state.sort === s ? 'desc' : (s === 'name' ? 'asc' : 'desc'));
    state.sort = s; state.offset = 0; refresh();
  });
  $('rules-prev').addEventListener('click', () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
  $('rules-next').addEventListener('click', () => { state.offset += PAGE; refresh(); });
  for (const r of document.querySelectorAll('input[name=window]')) r.addEventListener('change', () => { state.window = r.value; refresh(); });
}

wire();
route();
setInterval(refresh, REFRESH_MS);
