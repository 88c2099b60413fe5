// A sandbox's page: summary and actions, routes and signed URLs, the effective policy as
// rules with the explain box, a per-minute chart, and the live egress audit stream (SSE).
import { api, el, replace, report, note, clear, run, fmtDuration, fmtTime, endpointURL, endpointLink } from './common.js';
import { drawMinutes } from './charts.js';
import './timeline.js';
import './desktop.js';

const id = decodeURIComponent(location.pathname.split('/').pop());
const q = (s) => document.getElementById(s);
q('sb-id').textContent = id;
document.title = `${id} · Airlock console`;
const base = `/console/api/v1/sandboxes/${encodeURIComponent(id)}`;
const sbMsg = q('sb-msg');

let gone = false;
async function loadSandbox() {
  if (gone) return;
  try {
    const sb = await api('GET', base);
    const st = sb.status.state;
    q('sb-state').textContent = st + (sb.status.message ? ` (${sb.status.message})` : '');
    q('sb-state').dataset.state = st;
    q('sb-image').textContent = sb.image?.uri ?? '—';
    q('sb-created').textContent = `${fmtTime(sb.createdAt)} (${fmtDuration(Date.now() - Date.parse(sb.createdAt))} ago)`;
    q('sb-expires').textContent = sb.expiresAt ? `${fmtTime(sb.expiresAt)} (in ${fmtDuration(Date.parse(sb.expiresAt) - Date.now())})` : 'never (manual cleanup)';
    q('sb-pause').hidden = st === 'Paused';
    q('sb-resume').hidden = st !== 'Paused';
  } catch (e) {
    if (e.status === 404) {
      gone = true;
      q('sb-state').textContent = 'gone';
      report(sbMsg, 'This sandbox no longer exists', e);
      return;
    }
    report(sbMsg, 'Reading the sandbox failed', e);
  }
}

async function action(button, what, method, path, body, done) {
  clear(sbMsg);
  await run(button, sbMsg, what, async () => {
    const r = await api(method, path, body);
    note(sbMsg, done(r));
    await loadSandbox();
  });
}
q('sb-renew').addEventListener('click', (e) => action(e.currentTarget, 'Renew', 'POST', `${base}/renew-expiration`,
  { expiresAt: new Date(Date.now() + 3600e3).toISOString() }, (r) => `Expires ${fmtTime(r.expiresAt)}.`));
q('sb-pause').addEventListener('click', (e) => action(e.currentTarget, 'Pause', 'POST', `${base}/pause`, undefined, () => 'Paused.'));
q('sb-resume').addEventListener('click', (e) => action(e.currentTarget, 'Resume', 'POST', `${base}/resume`, undefined, () => 'Resumed.'));
let armed = null;
q('sb-delete').addEventListener('click', (e) => {
  const b = e.currentTarget;
  if (!armed) {
    b.textContent = 'Confirm delete';
    armed = setTimeout(() => { armed = null; b.textContent = 'Delete'; }, 5000);
    return;
  }
  clearTimeout(armed);
  armed = null;
  run(b, sbMsg, 'Delete', async () => {
    await api('DELETE', base);
    location.assign('/console/?deleted=' + encodeURIComponent(id));
  });
});

// Routes: execd and the egress API always exist; more ports are added by hand.
const routeMsg = q('routes-msg');
const known = { 44772: 'execd (commands, files, code)', 18080: 'egress API (OpenSandbox)' };
async function addRoute(port) {
  const tbody = q('routes').querySelector('tbody');
  const existing = tbody.querySelector(`tr[data-port="${port}"]`);
  const tr = existing ?? el('tr', { 'data-port': port });
  try {
    const ep = await api('GET', `${base}/endpoints/${port}`);
    const url = endpointURL(ep.endpoint);
    const needs = Object.keys(ep.headers ?? {});
    replace(tr, el('td', {}, port), el('td', {}, known[port] ?? 'service'),
      el('td', {}, endpointLink(port, url)),
      el('td', {}, needs.length ? `header ${needs.join(', ')} (or a signed URL)` : 'nothing (public)'));
    if (!existing) tbody.append(tr);
  } catch (e) {
    report(routeMsg, `Endpoint of port ${port} failed`, e);
  }
}
q('route-add').addEventListener('submit', (e) => {
  e.preventDefault();
  clear(routeMsg);
  addRoute(Number(q('route-port').value));
});

q('sign-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const msg = q('sign-msg');
  clear(msg);
  q('sign-out').hidden = true;
  const port = Number(q('sign-port').value);
  const expires = Math.floor(Date.now() / 1000) + 60 * Number(q('sign-minutes').value);
  await run(q('sign-submit'), msg, 'Minting a signed URL', async () => {
    const ep = await api('GET', `${base}/endpoints/${port}?expires=${expires}`);
    const out = q('signed-url');
    replace(out, endpointLink(port, endpointURL(ep.endpoint)));
    q('signed-expiry').textContent = `valid until ${fmtTime(new Date(expires * 1000).toISOString())}`;
    q('sign-out').hidden = false;
    out.querySelector('a, button')?.focus();
  });
});

q('sign-revoke').addEventListener('click', (e) => {
  const msg = q('sign-msg');
  clear(msg);
  run(e.currentTarget, msg, 'Revoking the signed URLs', async () => {
    const r = await api('POST', `${base}/signed-urls/revoke`);
    q('sign-out').hidden = true;
    note(msg, `Every signed URL minted before is revoked (epoch ${r.signedUrlEpoch}).`);
  });
});

// The effective policy as a rules table.
async function loadPolicy() {
  const msg = q('policy-msg');
  try {
    const p = await api('GET', `${base}/policy`);
    const doc = p.policy;
    const name = p.name || p.policyName || doc?.name || '';
    const tbody = q('policy-rules').querySelector('tbody');
    if (!doc) {
      q('sb-policy').textContent = `${name || '—'} (operator default, v${p.version})`;
      q('policy-summary').textContent = 'No policy: the operator default applies (allow, except the overlay and private addresses).';
      replace(tbody);
      return;
    }
    q('sb-policy').textContent = `${name || '—'} v${p.version}`;
    q('policy-summary').textContent = [
      name ? `named policy ${name}` : 'literal policy', `version ${p.version}`,
      `default ${doc.defaultAction ?? 'deny'}`, `mode ${doc.mode ?? 'enforce'}`, `l7 ${doc.l7 ?? 'off'}`, `audit ${doc.audit ?? 'all'}`,
    ].join(' · ');
    const rules = doc.egress ?? [];
    replace(tbody, rules.map((r, i) => el('tr', {},
      el('td', {}, i), el('td', { class: 'act-' + r.action }, r.action), el('td', {}, el('code', {}, r.target)),
      el('td', {}, (r.ports ?? []).join(', ') || 'all'), el('td', {}, (r.protocols ?? []).join(', ') || 'tcp, udp'),
      el('td', {}, r.comment ?? ''))));
    if (!rules.length) tbody.append(el('tr', {}, el('td', { colspan: 6 }, 'no rules: the default decides')));
  } catch (e) {
    report(msg, 'Reading the policy failed', e);
  }
}

q('explain-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const msg = q('explain-msg');
  clear(msg);
  const params = new URLSearchParams({ target: q('ex-target').value.trim(), port: q('ex-port').value || '0', proto: q('ex-proto').value });
  await run(q('ex-submit'), msg, 'Explain', async () => {
    const x = await api('GET', `/console/api/sandboxes/${encodeURIComponent(id)}/explain?${params}`);
    const at = (x.port ? `port ${x.port}` : 'any port') + (x.proto !== 'any' ? '/' + x.proto : '');
    const out = q('explain-out');
    replace(out,
      el('p', { id: 'explain-decision', class: 'decision act-' + x.action },
        `${x.target} (${x.kind}${x.class ? ', class ' + x.class : ''}) at ${at}: `, el('strong', {}, x.action + (x.wouldDeny ? ' (report mode: enforce would deny)' : ''))),
      el('dl', { class: 'summary' }, el('dt', {}, 'Rule'), el('dd', {}, x.rule), el('dt', {}, 'Reason'), el('dd', {}, x.reason),
        x.reach ? [el('dt', {}, 'Reach'), el('dd', {}, x.reach)] : '',
        x.floor ? [el('dt', {}, 'Floor'), el('dd', { id: 'explain-floor' }, x.floor)] : '',
        el('dt', {}, 'Policy'), el('dd', {}, x.defaultPolicy ? `operator default (v${x.policyVersion})` : `v${x.policyVersion}`)),
      x.matches.length ? el('table', {},
        el('caption', {}, 'Matching rules in evaluation order'),
        el('thead', {}, el('tr', {}, ['Rule', 'Layer', 'Action', 'Target', 'Scope', 'Note'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, x.matches.map((m) => el('tr', { class: m.decides ? 'decides' : '' },
          el('td', {}, m.Rule), el('td', {}, m.Layer), el('td', {}, m.Action), el('td', {}, el('code', {}, m.Target)), el('td', {}, m.Scope),
          el('td', {}, m.decides ? 'decides' : m.shadowed ? 'shadowed' : !m.Covers ? 'other ports/protocols' : '', m.Comment ? ` (${m.Comment})` : '')))))
        : el('p', {}, 'No rule matches: the default applies.'));
  });
});

// The platform floor, listed when its details element is first opened.
q('floor').addEventListener('toggle', async () => {
  if (!q('floor').open || q('floor-table').querySelector('tbody').children.length) return;
  try {
    const f = await api('GET', '/console/api/floor');
    q('floor-table').querySelector('tbody').append(...f.entries.map((e) => el('tr', {},
      el('td', {}, e.rule), el('td', {}, el('code', {}, e.target)), el('td', {}, e.source), el('td', {}, e.note),
      el('td', {}, e.overridable ? 'only by an explicit IP/CIDR rule' : 'never'))));
  } catch (e) {
    report(q('floor-msg'), 'Reading the platform floor failed', e);
  }
});

// Per-minute chart of this sandbox.
async function loadChart() {
  try {
    const s = await api('GET', `/console/api/stats?minutes=30&sandbox=${encodeURIComponent(id)}`);
    clear(q('chart-msg'));
    drawMinutes(q('sb-chart'), s);
  } catch (e) {
    report(q('chart-msg'), 'Reading the statistics failed', e);
  }
}

// The live stream: EventSource on the console's SSE route; filters are applied by the
// server (changing them reconnects). Newest first, at most 500 rows.
const streamBody = q('stream').querySelector('tbody');
const status = q('stream-status');
let es = null, paused = false, chartTimer = null;
function destination(r) {
  if (r.dst_host) return r.dst_host + (r.dst_port ? ':' + r.dst_port : '') + (r.qtype ? ` (${r.qtype})` : '');
  if (r.dst_ip) return r.dst_ip + (r.dst_port ? ':' + r.dst_port : '');
  return '—';
}
function addRecord(r) {
  const tr = el('tr', { 'data-seq': r.seq, 'data-action': r.action, 'data-source': r.source, class: 'rec-' + r.action },
    el('td', {}, new Date(r.time).toLocaleTimeString(undefined, { hour12: false }) + '.' + String(new Date(r.time).getMilliseconds()).padStart(3, '0')),
    el('td', {}, r.source), el('td', { class: 'act-' + r.action }, r.action + (r.would_deny ? ' (would deny)' : '')),
    el('td', { class: 'dst' }, destination(r)), el('td', {}, r.rule ?? ''), el('td', {}, r.reason ?? ''));
  streamBody.prepend(tr);
  while (streamBody.children.length > 500) streamBody.lastChild.remove();
}
function connect() {
  es?.close();
  replace(streamBody);
  const params = new URLSearchParams({ action: q('f-action').value, source: q('f-source').value, host: q('f-host').value.trim() });
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  status.textContent = 'connecting…';
  delete status.dataset.live;
  es = new EventSource(`/console/api/sandboxes/${encodeURIComponent(id)}/events?${params}`);
  es.addEventListener('ready', () => { status.textContent = 'live'; status.dataset.live = '1'; });
  es.addEventListener('record', (ev) => {
    if (paused) return;
    addRecord(JSON.parse(ev.data));
    // New decisions: redraw the chart soon (at most every 2 s).
    if (!chartTimer) chartTimer = setTimeout(() => { chartTimer = null; loadChart(); }, 2000);
  });
  es.addEventListener('expired', () => { es.close(); location.assign('/console/login?expired=1&next=' + encodeURIComponent(location.pathname)); });
  es.onerror = async () => {
    status.textContent = 'reconnecting…';
    delete status.dataset.live;
    // A closed stream may mean an expired session or a deleted sandbox: ask.
    try { await api('GET', '/console/api/session'); await loadSandbox(); } catch { /* api() redirects on expiry */ }
    if (gone) { es.close(); status.textContent = 'stopped: the sandbox is gone'; }
  };
}
q('stream-filter').addEventListener('submit', (e) => { e.preventDefault(); connect(); });
q('stream-pause').addEventListener('click', (e) => {
  paused = !paused;
  e.currentTarget.setAttribute('aria-pressed', String(paused));
  e.currentTarget.textContent = paused ? 'Resume' : 'Pause';
  status.textContent = paused ? 'paused (new records are dropped)' : 'live';
});

loadSandbox();
loadPolicy();
// The pending proposal view, loaded after this page's handlers are in place.
import('./proposal.js').then((m) => m.initProposal(id));
document.addEventListener('airlock:policy-changed', loadPolicy);
addRoute(44772);
addRoute(18080);
loadChart();
connect();
setInterval(loadSandbox, 3000);
setInterval(loadChart, 30000);
setInterval(loadPolicy, 10000);
