// hookd's customer portal: a single page over the JSON API.
//
// Rule: every string that comes from the API (URLs, descriptions, event
// types, response snippets, error messages) reaches the page through
// text nodes only: `el()` turns string children into text nodes and sets
// attributes with setAttribute. Nothing here parses markup.
'use strict';

(function () {
  const TOKEN_KEY = 'hookd.token';
  const ROLE_KEY = 'hookd.role';
  const main = document.getElementById('main');
  const statusLine = document.getElementById('status');
  const who = document.getElementById('who');
  const signoutButton = document.getElementById('signout');
  const SVG = 'http://www.w3.org/2000/svg'; // a namespace name, never fetched
  let timers = [];
  let renderSeq = 0;

  // --- DOM helpers ---------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') {
        node.addEventListener(k.slice(2), v);
      } else if (k === 'value') {
        node.value = v;
      } else if (k === 'checked') {
        node.checked = Boolean(v);
      } else {
        node.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }

  function append(node, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function say(message, isError) {
    statusLine.textContent = message || '';
    statusLine.classList.toggle('error', Boolean(isError));
  }

  // A message to show on the page a navigation leads to: a route change
  // clears the status line, so a message set just before one would vanish.
  let carried = '';
  function sayThenGo(message, hash) {
    say(message);
    if (location.hash === hash) {
      render();
    } else {
      carried = message;
      location.hash = hash;
    }
  }

  function every(ms, fn) {
    timers.push(setInterval(fn, ms));
  }

  function fmtTime(s) {
    if (!s) return '—';
    const d = new Date(s);
    return isNaN(d) ? String(s) : d.toLocaleString();
  }

  function fmtDuration(secs) {
    if (secs === null || secs === undefined) return '—';
    if (secs < 90) return secs + ' s';
    if (secs < 5400) return Math.round(secs / 60) + ' min';
    if (secs < 172800) return Math.round(secs / 3600) + ' h';
    return Math.round(secs / 86400) + ' d';
  }

  function fmtRate(r) {
    return r === null || r === undefined ? '—' : (r * 100).toFixed(r >= 0.995 || r === 0 ? 0 : 1) + ' %';
  }

  // datetime-local value → RFC 3339 (UTC), or undefined when empty.
  function toRfc3339(v) {
    if (!v) return undefined;
    const d = new Date(v);
    return isNaN(d) ? undefined : d.toISOString();
  }

  function localInputValue(d) {
    const pad = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + 'T' + pad(d.getHours()) + ':' + pad(d.getMinutes());
  }

  // --- the API -------------------------------------------------------------

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function isAdmin() {
    return sessionStorage.getItem(ROLE_KEY) === 'admin';
  }

  class ApiFailure extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: 'Bearer ' + token() };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    if (resp.status === 401) {
      signOut('Your token was refused: sign in again.');
      throw new ApiFailure(401, 'unauthorized', 'unauthorized');
    }
    const text = await resp.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = text; }
    }
    if (!resp.ok) {
      const err = data && data.error ? data.error : {};
      throw new ApiFailure(resp.status, err.code || 'http_' + resp.status, err.message || resp.statusText);
    }
    return data;
  }

  function qs(params) {
    const parts = [];
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== '') parts.push(encodeURIComponent(k) + '=' + encodeURIComponent(v));
    }
    return parts.length ? '?' + parts.join('&') : '';
  }

  function failed(e) {
    if (e && e.status === 401) return;
    say(e && e.message ? 'Error: ' + e.message : 'Error: ' + String(e), true);
  }

  // --- sign-in -------------------------------------------------------------

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(ROLE_KEY);
    if (location.hash !== '#/') history.replaceState(null, '', '#/');
    render();
    if (message) say(message, true);
  }

  // Admin tokens may read /metrics; a customer token is told 404.
  async function learnRole() {
    const resp = await fetch('/metrics', { headers: { Authorization: 'Bearer ' + token() }, cache: 'no-store' });
    if (resp.status === 401) throw new ApiFailure(401, 'unauthorized', 'This token is not valid.');
    sessionStorage.setItem(ROLE_KEY, resp.ok ? 'admin' : 'customer');
  }

  function renderSignIn() {
    document.title = 'Sign in · hookd';
    const input = el('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', required: true, spellcheck: 'false' });
    const form = el('form', { class: 'stack signin', id: 'signin-form' },
      el('label', { for: 'token' }, 'API token'),
      input,
      el('p', { class: 'hint' }, 'A customer token shows that customer\u2019s subscriptions; the admin token shows every customer\u2019s. It is kept in this tab only.'),
      el('div', { class: 'actions' }, el('button', { type: 'submit', class: 'primary' }, 'Sign in')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      try {
        await learnRole();
        say('');
        render();
      } catch (e) {
        sessionStorage.removeItem(TOKEN_KEY);
        say(e.status === 401 ? 'That token was refused.' : 'Could not sign in: ' + e.message, true);
      }
    });
    main.append(el('h1', {}, 'Sign in'), form);
    input.focus();
  }

  // --- health badge ----------------------------------------------------------

  function judge(h) {
    if (h.state === 'disabled') return ['muted', 'disabled'];
    if (h.likely_configuration_error) return ['bad', 'configuration error ' + h.likely_configuration_error.status];
    if (h.circuit_state === 'open') return ['bad', 'circuit open'];
    if (h.shedding) return ['bad', 'shedding'];
    if (h.success_rate !== null && h.success_rate !== undefined && h.success_rate < 0.9) return ['bad', 'failing'];
    if (h.dead_count > 0) return ['warn', 'dead letters'];
    if (h.circuit_state === 'half_open') return ['warn', 'recovering'];
    if (h.success_rate !== null && h.success_rate !== undefined && h.success_rate < 0.99) return ['warn', 'degraded'];
    if (h.success_rate === null || h.success_rate === undefined) return ['ok', 'healthy (no recent attempts)'];
    return ['ok', 'healthy'];
  }

  function healthBadge(h) {
    const [level, label] = judge(h);
    return el('span', { class: 'badge ' + level, 'data-health': level }, label);
  }

  function healthFacts(h) {
    const facts = [
      'circuit ' + h.circuit_state.replace('_', '-'),
      'success ' + fmtRate(h.success_rate),
      'lag ' + fmtDuration(h.lag_secs),
      'pending ' + h.pending_count,
      'dead ' + h.dead_count,
    ];
    if (h.shedding) facts.push('shedding');
    if (h.likely_configuration_error) {
      const c = h.likely_configuration_error;
      facts.push('likely configuration error: ' + c.status + ' (' + fmtRate(c.share) + ' of failures)');
    }
    return facts.join(' · ');
  }

  // --- subscriptions list ----------------------------------------------------

  async function renderList(seq) {
    document.title = 'Subscriptions · hookd';
    const admin = isAdmin();
    const heading = el('h1', {}, 'Subscriptions');
    const filter = el('input', { type: 'text', id: 'filter-customer', name: 'customer_id', placeholder: 'all customers' });
    const tbody = el('tbody', { id: 'subscriptions' });
    const headers = ['Endpoint'];
    if (admin) headers.push('Customer');
    headers.push('Event types', 'State', 'Health');
    const table = el('table', { class: 'responsive' },
      el('caption', { class: 'visually-hidden' }, 'Subscriptions and their health'),
      el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
      tbody);
    const more = el('button', { type: 'button', id: 'more', hidden: true }, 'Load more');
    const empty = el('p', { id: 'empty', hidden: true }, 'No subscriptions yet. ', el('a', { href: '#/new' }, 'Create one'), '.');
    const refresh = el('button', { type: 'button', id: 'refresh' }, 'Refresh');
    const bar = el('div', { class: 'actions' }, el('a', { class: 'button primary', href: '#/new' }, 'New subscription'), refresh);
    main.append(heading, bar);
    if (admin) {
      const form = el('form', { class: 'filters' }, el('label', { for: 'filter-customer' }, 'Customer', filter), el('button', { type: 'submit' }, 'Filter'));
      form.addEventListener('submit', (ev) => { ev.preventDefault(); load(true); });
      main.append(form);
    }
    main.append(el('div', { class: 'scroll' }, table), empty, more);

    const healthCells = new Map();
    let cursor = null;

    async function loadHealth(id, cell) {
      try {
        const h = await api('GET', '/subscriptions/' + encodeURIComponent(id) + '/health');
        clear(cell);
        cell.append(healthBadge(h), el('span', { class: 'health-facts' }, healthFacts(h)));
      } catch (e) {
        clear(cell);
        cell.append(el('span', { class: 'badge muted' }, 'unknown'));
      }
    }

    async function load(reset) {
      if (reset) { cursor = null; clear(tbody); healthCells.clear(); }
      try {
        const page = await api('GET', '/subscriptions' + qs({ limit: 50, cursor, customer_id: admin ? filter.value.trim() : '' }));
        if (seq !== renderSeq) return;
        for (const s of page.data) {
          const healthCell = el('td', { 'data-label': 'Health', class: 'health' }, el('span', { class: 'badge muted' }, '…'));
          healthCells.set(s.sub_id, healthCell);
          const cells = [
            el('td', { class: 'url', 'data-label': 'Endpoint' },
              el('a', { href: '#/s/' + encodeURIComponent(s.sub_id) }, s.url),
              s.description ? el('span', { class: 'health-facts' }, s.description) : null),
          ];
          if (admin) cells.push(el('td', { 'data-label': 'Customer' }, s.customer_id || '(platform)'));
          cells.push(
            el('td', { class: 'wrap', 'data-label': 'Event types' }, s.event_types.join(', ')),
            el('td', { 'data-label': 'State' }, s.state),
            healthCell);
          tbody.append(el('tr', { 'data-sub-id': s.sub_id }, cells));
          loadHealth(s.sub_id, healthCell);
        }
        cursor = page.next_cursor;
        more.hidden = !cursor;
        empty.hidden = tbody.children.length > 0;
      } catch (e) { failed(e); }
    }

    more.addEventListener('click', () => load(false));
    refresh.addEventListener('click', () => load(true));
    every(5000, () => { for (const [id, cell] of healthCells) loadHealth(id, cell); });
    await load(true);
  }

  // --- create / edit ---------------------------------------------------------

  function splitList(s) {
    return s.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
  }

  function numberOrNull(v) {
    if (v === '' || v === undefined) return null;
    const n = Number(v);
    return Number.isFinite(n) ? n : v;
  }

  function showSecret(container, title, secret, onDone) {
    const done = el('button', { type: 'button', class: 'primary' }, 'I have saved it');
    const box = el('section', { class: 'secret', role: 'alert', 'aria-labelledby': 'secret-title' },
      el('h2', { id: 'secret-title' }, title),
      el('p', {}, 'This signing secret is shown only now. Store it where your receiver can read it.'),
      el('code', { id: 'secret' }, secret),
      done);
    done.addEventListener('click', () => { box.remove(); if (onDone) onDone(); });
    container.prepend(box);
    done.focus();
  }

  async function renderForm(seq, subId) {
    let sub = null;
    if (subId) {
      try { sub = await api('GET', '/subscriptions/' + encodeURIComponent(subId)); } catch (e) { failed(e); return; }
      if (seq !== renderSeq) return;
    }
    const editing = Boolean(sub);
    document.title = (editing ? 'Edit subscription' : 'New subscription') + ' · hookd';
    const rp = (sub && sub.retry_policy) || {};
    const field = (id, label, attrs, hint) => [
      el('label', { for: id }, label),
      el('input', Object.assign({ id, name: id }, attrs)),
      hint ? el('p', { class: 'hint' }, hint) : null,
    ];
    const form = el('form', { class: 'stack', id: 'subscription-form', novalidate: true },
      field('url', 'Endpoint URL', { type: 'url', required: true, value: sub ? sub.url : '' }),
      field('event_types', 'Event types', { type: 'text', required: true, value: sub ? sub.event_types.join(', ') : '' }, 'Exact types (invoice.paid), trailing wildcards (invoice.*) or *; separated by commas.'),
      field('description', 'Description', { type: 'text', value: sub && sub.description ? sub.description : '' }),
      !editing && isAdmin() ? field('customer_id', 'Customer id', { type: 'text' }, 'Empty: a platform subscription (no customer).') : null,
      el('label', { class: 'inline' }, el('input', { type: 'checkbox', id: 'ordered', name: 'ordered', checked: sub ? sub.ordered : false }), 'Ordered (one delivery in flight at a time, oldest first)'),
      field('rate_limit', 'Rate limit (attempts per second)', { type: 'number', min: 1, max: 10000, value: sub && sub.rate_limit ? sub.rate_limit : '' }, 'Empty: adapts to the endpoint.'),
      field('max_concurrency', 'Max concurrency', { type: 'number', min: 1, max: 1000, value: sub && sub.max_concurrency ? sub.max_concurrency : '' }, 'Empty: the server default.'),
      el('fieldset', {},
        el('legend', {}, 'Retry policy (empty fields follow the server default)'),
        field('base_delay_secs', 'First backoff bound (s)', { type: 'number', min: 1, value: rp.base_delay_secs ?? '' }),
        field('max_delay_secs', 'Largest backoff bound (s)', { type: 'number', min: 1, value: rp.max_delay_secs ?? '' }),
        field('max_age_secs', 'Give up after (s)', { type: 'number', min: 60, value: rp.max_age_secs ?? '' }),
        field('max_attempts', 'Give up after attempts', { type: 'number', min: 1, value: rp.max_attempts ?? '' }),
        field('retryable_statuses', 'Also retry these 4xx statuses', { type: 'text', value: rp.retryable_statuses ? rp.retryable_statuses.join(', ') : '' })),
      el('div', { class: 'actions' },
        el('button', { type: 'submit', class: 'primary' }, editing ? 'Save' : 'Create subscription'),
        el('a', { class: 'button', href: editing ? '#/s/' + encodeURIComponent(sub.sub_id) : '#/' }, 'Cancel')));

    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const v = (id) => { const i = form.querySelector('#' + id); return i ? i.value.trim() : ''; };
      const retry = {};
      for (const k of ['base_delay_secs', 'max_delay_secs', 'max_age_secs', 'max_attempts']) {
        if (v(k) !== '') retry[k] = numberOrNull(v(k));
      }
      if (v('retryable_statuses') !== '') retry.retryable_statuses = splitList(v('retryable_statuses')).map(Number);
      const body = {
        url: v('url'),
        event_types: splitList(v('event_types')),
        ordered: form.querySelector('#ordered').checked,
        retry_policy: retry,
      };
      const rate = numberOrNull(v('rate_limit'));
      const conc = numberOrNull(v('max_concurrency'));
      const desc = v('description');
      if (editing) {
        body.rate_limit = rate;
        body.max_concurrency = conc;
        body.description = desc === '' ? null : desc;
      } else {
        if (rate !== null) body.rate_limit = rate;
        if (conc !== null) body.max_concurrency = conc;
        if (desc !== '') body.description = desc;
        if (v('customer_id') !== '') body.customer_id = v('customer_id');
      }
      try {
        if (editing) {
          await api('PATCH', '/subscriptions/' + encodeURIComponent(sub.sub_id), body);
          sayThenGo('Saved.', '#/s/' + encodeURIComponent(sub.sub_id));
        } else {
          const created = await api('POST', '/subscriptions', body);
          say('Subscription created.');
          const target = '#/s/' + encodeURIComponent(created.sub_id);
          history.replaceState(null, '', target);
          await render();
          showSecret(main, 'Signing secret', created.secret);
        }
      } catch (e) { failed(e); }
    });
    main.append(el('h1', {}, editing ? 'Edit subscription' : 'New subscription'), form);
    form.querySelector('#url').focus();
  }

  // --- the 30-day chart ------------------------------------------------------

  function dayKey(d) {
    return d.toISOString().slice(0, 10);
  }

  function renderChart(container, rows) {
    clear(container);
    const byDay = new Map(rows.map((r) => [String(r.day).slice(0, 10), r]));
    const days = [];
    const today = new Date();
    for (let i = 29; i >= 0; i--) {
      const d = new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i));
      const key = dayKey(d);
      const r = byDay.get(key) || {};
      const lat = r.latency_ms || {};
      days.push({ day: key, delivered: r.delivered || 0, failed: r.failed || 0, dead: r.dead || 0, p50: lat.p50 ?? null, p99: lat.p99 ?? null });
    }
    const W = 600, H = 170, L = 40, R = 10, T = 10, B = 24;
    const plotW = W - L - R, plotH = H - T - B;
    const slot = plotW / days.length;
    const maxCount = Math.max(1, ...days.map((d) => d.delivered + d.failed + d.dead));
    const bars = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-labelledby': 'chart-counts-title' },
      svg('title', { id: 'chart-counts-title' }, 'Deliveries per day over the last 30 days: delivered, failed and dead'),
      svg('line', { class: 'axis', x1: L, y1: T + plotH, x2: W - R, y2: T + plotH }),
      svg('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, String(maxCount)),
      svg('text', { x: L - 4, y: T + plotH, 'text-anchor': 'end' }, '0'));
    days.forEach((d, i) => {
      let y = T + plotH;
      const x = L + i * slot + slot * 0.15;
      const w = slot * 0.7;
      for (const [k, color] of [['delivered', 'var(--delivered)'], ['failed', 'var(--failed)'], ['dead', 'var(--dead)']]) {
        if (!d[k]) continue;
        const h = (d[k] / maxCount) * plotH;
        y -= h;
        bars.append(svg('rect', { x: x.toFixed(1), y: y.toFixed(1), width: w.toFixed(1), height: h.toFixed(1), fill: color, 'data-kind': k },
          svg('title', {}, d.day + ': ' + d[k] + ' ' + k)));
      }
      if (i % 5 === 0 || i === days.length - 1) {
        bars.append(svg('text', { x: (L + i * slot + slot / 2).toFixed(1), y: H - 8, 'text-anchor': 'middle' }, d.day.slice(5)));
      }
    });
    const maxLat = Math.max(1, ...days.map((d) => Math.max(d.p50 || 0, d.p99 || 0)));
    const lat = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-labelledby': 'chart-latency-title' },
      svg('title', { id: 'chart-latency-title' }, 'Latency per day over the last 30 days: p50 and p99, in milliseconds'),
      svg('line', { class: 'axis', x1: L, y1: T + plotH, x2: W - R, y2: T + plotH }),
      svg('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, Math.round(maxLat) + ' ms'),
      svg('text', { x: L - 4, y: T + plotH, 'text-anchor': 'end' }, '0'));
    for (const [k, color] of [['p50', 'var(--p50)'], ['p99', 'var(--p99)']]) {
      const pts = [];
      days.forEach((d, i) => {
        if (d[k] === null) return;
        const x = L + i * slot + slot / 2;
        const y = T + plotH - (d[k] / maxLat) * plotH;
        pts.push(x.toFixed(1) + ',' + y.toFixed(1));
        lat.append(svg('circle', { cx: x.toFixed(1), cy: y.toFixed(1), r: 2.5, fill: color }, svg('title', {}, d.day + ': ' + k + ' ' + d[k] + ' ms')));
      });
      if (pts.length > 1) lat.append(svg('polyline', { points: pts.join(' '), fill: 'none', stroke: color, 'stroke-width': 1.5 }));
    }
    const legend = (items) => el('ul', { class: 'legend' }, items.map(([k, label]) => el('li', {}, el('span', { class: 'swatch sw-' + k, 'aria-hidden': 'true' }), label)));
    const table = el('table', {},
      el('thead', {}, el('tr', {}, ['Day', 'Delivered', 'Failed', 'Dead', 'p50 (ms)', 'p99 (ms)'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', {}, days.filter((d) => d.delivered || d.failed || d.dead).map((d) =>
        el('tr', {}, [d.day, d.delivered, d.failed, d.dead, d.p50 ?? '—', d.p99 ?? '—'].map((x) => el('td', {}, x))))));
    container.append(
      legend([['delivered', 'delivered'], ['failed', 'failed'], ['dead', 'dead']]), bars,
      legend([['p50', 'p50 latency'], ['p99', 'p99 latency']]), lat,
      el('details', {}, el('summary', {}, 'Show as a table'), el('div', { class: 'scroll' }, table)));
  }

  // --- one subscription ------------------------------------------------------

  function kv(pairs) {
    return el('dl', { class: 'kv' }, pairs.filter(Boolean).map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  }

  function retryText(rp) {
    const parts = [];
    if (!rp) return 'server default';
    if (rp.base_delay_secs) parts.push('first backoff ≤ ' + rp.base_delay_secs + ' s');
    if (rp.max_delay_secs) parts.push('backoff ≤ ' + rp.max_delay_secs + ' s');
    if (rp.max_age_secs) parts.push('give up after ' + fmtDuration(rp.max_age_secs));
    if (rp.max_attempts) parts.push('at most ' + rp.max_attempts + ' attempts');
    if (rp.retryable_statuses && rp.retryable_statuses.length) parts.push('also retry ' + rp.retryable_statuses.join(', '));
    return parts.length ? parts.join('; ') : 'server default';
  }

  function attemptTable(attempts) {
    if (!attempts || !attempts.length) return el('p', { class: 'hint' }, 'No attempts yet.');
    return el('div', { class: 'scroll' }, el('table', { class: 'responsive attempts' },
      el('thead', {}, el('tr', {}, ['#', 'Started', 'Status', 'Duration', 'Error class', 'Response'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', {}, attempts.map((a) => el('tr', {},
        el('td', { 'data-label': '#' }, a.number),
        el('td', { 'data-label': 'Started' }, fmtTime(a.started_at)),
        el('td', { 'data-label': 'Status' }, a.status ?? '—'),
        el('td', { 'data-label': 'Duration' }, a.duration_ms + ' ms'),
        el('td', { 'data-label': 'Error class' }, a.error_class || '—'),
        el('td', { 'data-label': 'Response', class: 'wrap' }, a.response_snippet ? el('pre', { class: 'snippet' }, a.response_snippet) : '—'))))));
  }

  async function renderSubscription(seq, subId) {
    const base = '/subscriptions/' + encodeURIComponent(subId);
    let sub;
    try { sub = await api('GET', base); } catch (e) {
      if (seq !== renderSeq) return;
      if (e.status === 404) {
        main.append(el('h1', {}, 'Not found'), el('p', { id: 'not-found' }, 'There is no such subscription, or it is not yours.'), el('p', {}, el('a', { href: '#/' }, 'Back to subscriptions')));
      } else failed(e);
      return;
    }
    if (seq !== renderSeq) return;
    document.title = sub.url + ' · hookd';

    // Header and actions.
    const toggle = el('button', { type: 'button', id: 'toggle-state' }, sub.state === 'active' ? 'Pause' : 'Resume');
    const rotate = el('button', { type: 'button', id: 'rotate' }, 'Rotate secret');
    const del = el('button', { type: 'button', id: 'delete', class: 'danger' }, 'Delete');
    main.append(
      el('p', {}, el('a', { href: '#/' }, '← Subscriptions')),
      el('h1', { id: 'sub-url' }, sub.url),
      el('div', { class: 'actions' }, toggle, el('a', { class: 'button', href: '#/s/' + encodeURIComponent(sub.sub_id) + '/edit' }, 'Edit'), rotate, del));
    toggle.addEventListener('click', async () => {
      try {
        await api('PATCH', base, { state: sub.state === 'active' ? 'disabled' : 'active' });
        say(sub.state === 'active' ? 'Paused: deliveries are kept, not attempted.' : 'Resumed.');
        render();
      } catch (e) { failed(e); }
    });
    rotate.addEventListener('click', async () => {
      if (!confirm('Make a new signing secret? The old one keeps signing for 24 hours.')) return;
      try {
        const r = await api('POST', base + '/secret/rotate', {});
        showSecret(main, 'New signing secret', r.secret);
        say('Secret rotated; the previous one works until ' + fmtTime(r.previous_expires_at) + '.');
      } catch (e) { failed(e); }
    });
    del.addEventListener('click', async () => {
      if (!confirm('Delete this subscription? Its deliveries stop.')) return;
      try { await api('DELETE', base); sayThenGo('Subscription deleted.', '#/'); } catch (e) { failed(e); }
    });

    // Health.
    const healthBox = el('div', { id: 'health' }, el('p', {}, 'Loading…'));
    async function loadHealth() {
      try {
        const h = await api('GET', base + '/health');
        clear(healthBox);
        const signals = (h.signals || []).map((s) => s.kind + (s.detail ? ': ' + s.detail : ''));
        const counts = Object.entries(h.last_status_counts || {}).map(([k, n]) => k + ' × ' + n).join(', ');
        healthBox.append(
          el('p', {}, healthBadge(h)),
          kv([
            ['Circuit', h.circuit_state.replace('_', '-')],
            ['Success rate (1 h)', fmtRate(h.success_rate)],
            ['Lag', fmtDuration(h.lag_secs)],
            ['Pending', String(h.pending_count)],
            ['Dead', String(h.dead_count) + (h.oldest_dead_at ? ' (oldest ' + fmtTime(h.oldest_dead_at) + ')' : '')],
            ['Shedding', h.shedding ? 'yes: new events are refused (429)' : 'no'],
            ['Likely configuration error', h.likely_configuration_error ? 'your endpoint answers ' + h.likely_configuration_error.status + ' to ' + fmtRate(h.likely_configuration_error.share) + ' of failed attempts' : 'none'],
            ['Last hour', counts || 'no attempts'],
            signals.length ? ['Signals', signals.join('; ')] : null,
          ]));
      } catch (e) { if (e.status !== 401) { clear(healthBox); healthBox.append(el('p', { class: 'error' }, 'Health unavailable: ' + e.message)); } }
    }

    // Settings.
    const settings = kv([
      ['Id', sub.sub_id],
      isAdmin() || sub.customer_id ? ['Customer', sub.customer_id || '(platform)'] : null,
      ['State', sub.state],
      ['URL', sub.url],
      ['Event types', sub.event_types.join(', ')],
      ['Ordered', sub.ordered ? 'yes' : 'no'],
      ['Retry policy', retryText(sub.retry_policy)],
      ['Rate limit', sub.rate_limit ? sub.rate_limit + ' / s' : 'adaptive'],
      ['Max concurrency', sub.max_concurrency ? String(sub.max_concurrency) : 'server default'],
      ['Description', sub.description || '—'],
      ['Created', fmtTime(sub.created_at)],
      ['Updated', fmtTime(sub.updated_at)],
    ]);

    // Chart.
    const chart = el('div', { class: 'chart', id: 'chart' }, el('p', {}, 'Loading…'));
    api('GET', base + '/stats?days=30').then((s) => renderChart(chart, s.data || []), (e) => { clear(chart); chart.append(el('p', { class: 'error' }, 'Stats unavailable: ' + e.message)); });

    // Bulk replay.
    const since = el('input', { type: 'datetime-local', id: 'replay-since', name: 'since', required: true, value: localInputValue(new Date(Date.now() - 24 * 3600 * 1000)) });
    const until = el('input', { type: 'datetime-local', id: 'replay-until', name: 'until' });
    const statusBoxes = ['failed', 'dead', 'delivered'].map((s) =>
      el('label', { class: 'inline' }, el('input', { type: 'checkbox', name: 'statuses', value: s, checked: s !== 'delivered' }), s));
    const types = el('input', { type: 'text', id: 'replay-types', name: 'types', placeholder: 'all types' });
    const progressBox = el('div', { id: 'replay-progress', 'aria-live': 'polite' });
    const replayForm = el('form', { class: 'stack', id: 'replay-form' },
      el('div', { class: 'filters' },
        el('label', { for: 'replay-since' }, 'Created since', since),
        el('label', { for: 'replay-until' }, 'until (empty: now)', until),
        el('label', { for: 'replay-types' }, 'Event types', types)),
      el('fieldset', {}, el('legend', {}, 'Statuses'), statusBoxes),
      el('div', { class: 'actions' }, el('button', { type: 'submit', id: 'replay-start' }, 'Start bulk replay')),
      progressBox);
    replayForm.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const body = { since: toRfc3339(since.value) };
      if (until.value) body.until = toRfc3339(until.value);
      const ts = splitList(types.value);
      if (ts.length) body.types = ts;
      body.statuses = statusBoxes.map((l) => l.querySelector('input')).filter((i) => i.checked).map((i) => i.value);
      try {
        const job = await api('POST', base + '/replay', body);
        watchJob(job);
      } catch (e) { failed(e); }
    });

    function watchJob(job) {
      clear(progressBox);
      const bar = el('progress', { id: 'job-progress', max: 100, value: 0 });
      const label = el('span', { id: 'job-label' });
      const cancel = el('button', { type: 'button', id: 'job-cancel' }, 'Cancel job');
      progressBox.append(el('p', {}, 'Replay job ', el('code', {}, job.job_id)), el('div', { class: 'progress' }, el('label', { for: 'job-progress', class: 'visually-hidden' }, 'Replay progress'), bar, label, cancel));
      let stopped = false;
      function show(j) {
        const finished = j.done + j.failed + j.skipped;
        const pct = j.total === 0 ? (j.state === 'running' ? 0 : 100) : Math.floor((finished * 100) / j.total);
        bar.value = pct;
        bar.setAttribute('data-state', j.state);
        label.textContent = pct + ' % · ' + finished + '/' + j.total + ' · delivered ' + j.done + ' · failed ' + j.failed + ' · skipped ' + j.skipped + ' · sending ' + j.in_progress + ' · ' + j.state;
        label.setAttribute('data-percent', String(pct));
        label.setAttribute('data-state', j.state);
        if (j.state !== 'running') { stopped = true; cancel.hidden = true; }
      }
      show(job);
      cancel.addEventListener('click', async () => {
        try { show(await api('DELETE', '/jobs/' + encodeURIComponent(job.job_id))); } catch (e) { failed(e); }
      });
      const seqNow = renderSeq;
      (async function poll() {
        while (!stopped && seqNow === renderSeq) {
          await new Promise((r) => setTimeout(r, 500));
          if (seqNow !== renderSeq) return;
          try { show(await api('GET', '/jobs/' + encodeURIComponent(job.job_id))); } catch (e) { failed(e); return; }
        }
        if (seqNow === renderSeq) { loadHealth(); loadLog(true); }
      })();
    }

    // Delivery log.
    const fStatus = el('select', { id: 'f-status', name: 'status' }, ['', 'pending', 'inflight', 'delivered', 'failed', 'dead'].map((s) => el('option', { value: s }, s || 'any')));
    const fType = el('input', { type: 'text', id: 'f-type', name: 'event_type', placeholder: 'any' });
    const fSince = el('input', { type: 'datetime-local', id: 'f-since', name: 'since' });
    const fUntil = el('input', { type: 'datetime-local', id: 'f-until', name: 'until' });
    const logForm = el('form', { class: 'filters', id: 'log-filters' },
      el('label', { for: 'f-status' }, 'Status', fStatus),
      el('label', { for: 'f-type' }, 'Event type', fType),
      el('label', { for: 'f-since' }, 'Since', fSince),
      el('label', { for: 'f-until' }, 'Until', fUntil),
      el('button', { type: 'submit', id: 'log-apply' }, 'Apply'),
      el('button', { type: 'button', id: 'log-refresh' }, 'Refresh'));
    const log = el('div', { id: 'deliveries' });
    const logMore = el('button', { type: 'button', id: 'log-more', hidden: true }, 'Older deliveries');
    let logCursor = null;
    logForm.addEventListener('submit', (ev) => { ev.preventDefault(); loadLog(true); });
    logForm.querySelector('#log-refresh').addEventListener('click', () => { loadLog(true); loadHealth(); });
    logMore.addEventListener('click', () => loadLog(false));

    function deliveryItem(d) {
      const replay = el('button', { type: 'button', class: 'replay-one' }, 'Replay');
      replay.addEventListener('click', async () => {
        try { await api('POST', '/deliveries/' + encodeURIComponent(d.delivery_id) + '/replay'); say('Delivery ' + d.delivery_id + ' queued again.'); loadLog(true); } catch (e) { failed(e); }
      });
      const lastAttempt = d.attempts && d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
      return el('details', { class: 'delivery', 'data-delivery-id': d.delivery_id, 'data-state': d.state },
        el('summary', {},
          el('strong', { class: 'state-' + d.state }, d.state),
          el('span', {}, d.event_type),
          el('span', {}, fmtTime(d.created_at)),
          el('span', {}, d.attempt + (d.attempt === 1 ? ' attempt' : ' attempts')),
          lastAttempt && lastAttempt.status ? el('span', {}, 'last ' + lastAttempt.status) : null),
        kv([
          ['Delivery', d.delivery_id],
          ['Event', d.event_id],
          d.next_attempt_at ? ['Next attempt', fmtTime(d.next_attempt_at)] : null,
          d.last_error ? ['Last error', d.last_error] : null,
        ]),
        el('h3', { class: 'visually-hidden' }, 'Attempts'),
        attemptTable(d.attempts),
        el('div', { class: 'actions' }, replay));
    }

    async function loadLog(reset) {
      if (reset) logCursor = null;
      log.setAttribute('aria-busy', 'true');
      try {
        const page = await api('GET', base + '/deliveries' + qs({ status: fStatus.value, event_type: fType.value.trim(), since: toRfc3339(fSince.value), until: toRfc3339(fUntil.value), cursor: logCursor, limit: 25 }));
        if (seq !== renderSeq) return;
        if (reset) {
          // Keep open the deliveries the reader had opened.
          const open = new Set(Array.from(log.querySelectorAll('details[open]')).map((n) => n.getAttribute('data-delivery-id')));
          clear(log);
          page.data.forEach((d) => { const item = deliveryItem(d); if (open.has(d.delivery_id)) item.open = true; log.append(item); });
        } else {
          page.data.forEach((d) => log.append(deliveryItem(d)));
        }
        if (!log.children.length) log.append(el('p', { class: 'hint' }, 'No deliveries match.'));
        logCursor = page.next_cursor;
        logMore.hidden = !logCursor;
      } catch (e) { failed(e); } finally { log.removeAttribute('aria-busy'); }
    }

    main.append(
      el('section', { 'aria-labelledby': 'h-health' }, el('h2', { id: 'h-health' }, 'Health'), healthBox),
      el('section', { 'aria-labelledby': 'h-settings' }, el('h2', { id: 'h-settings' }, 'Settings'), settings),
      el('section', { 'aria-labelledby': 'h-chart' }, el('h2', { id: 'h-chart' }, 'Last 30 days'), chart),
      el('section', { 'aria-labelledby': 'h-log' }, el('h2', { id: 'h-log' }, 'Deliveries'), logForm, log, logMore),
      el('section', { 'aria-labelledby': 'h-replay' }, el('h2', { id: 'h-replay' }, 'Bulk replay'),
        el('p', { class: 'hint' }, 'Sends again the deliveries created in the window with the chosen statuses, paced to what your endpoint accepts.'), replayForm));
    every(3000, loadHealth);
    await Promise.all([loadHealth(), loadLog(true)]);
  }

  // --- routing ---------------------------------------------------------------

  async function render() {
    const seq = ++renderSeq;
    timers.forEach(clearInterval);
    timers = [];
    clear(main);
    const signedIn = Boolean(token());
    signoutButton.hidden = !signedIn;
    document.getElementById('nav').hidden = !signedIn;
    who.textContent = signedIn ? (isAdmin() ? 'Signed in as admin (all customers)' : 'Signed in with a customer token') : '';
    if (!signedIn) { renderSignIn(); return; }
    if (!sessionStorage.getItem(ROLE_KEY)) {
      try { await learnRole(); } catch (e) { failed(e); return; }
      if (seq !== renderSeq) return;
      who.textContent = isAdmin() ? 'Signed in as admin (all customers)' : 'Signed in with a customer token';
    }
    const route = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
    try {
      if (route[0] === '' || route[0] === undefined) await renderList(seq);
      else if (route[0] === 'new') await renderForm(seq, null);
      else if (route[0] === 's' && route[1] && route[2] === 'edit') await renderForm(seq, route[1]);
      else if (route[0] === 's' && route[1]) await renderSubscription(seq, route[1]);
      else main.append(el('h1', {}, 'Not found'), el('p', {}, el('a', { href: '#/' }, 'Back to subscriptions')));
    } catch (e) { failed(e); }
    if (seq === renderSeq) main.setAttribute('data-ready', String(seq));
  }

  // A portal link: /ui#token=… (a fragment, so it never reaches a server log).
  function takeTokenFromFragment() {
    const m = /^#token=([^&]+)/.exec(location.hash);
    if (!m) return;
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    sessionStorage.removeItem(ROLE_KEY);
    history.replaceState(null, '', location.pathname + '#/');
  }

  signoutButton.addEventListener('click', () => { signOut(); say('Signed out.'); });
  window.addEventListener('hashchange', () => { say(carried); carried = ''; render(); });
  takeTokenFromFragment();
  render();
})();
