// The sandboxes page: list (refreshed every 2 s, rows updated in place so focus stays),
// create, renew, pause/resume, delete and open an endpoint.
import { api, el, replace, report, note, clear, run, fmtDuration, fmtTime, endpointURL, endpointLink } from './common.js';

const tbody = document.querySelector('#sandboxes tbody');
const listMsg = document.getElementById('list-msg');
const rows = new Map(); // id -> {tr, state, cells}

// Named policies (GET /v1/policies), when the policy library exists.
async function loadPolicies() {
  const sel = document.getElementById('c-policy');
  try {
    const data = await api('GET', '/console/api/v1/policies');
    const items = Array.isArray(data) ? data : (data?.items ?? data?.policies ?? []);
    const group = el('optgroup', { label: 'Policy library' });
    for (const p of items) {
      const name = typeof p === 'string' ? p : p.name;
      if (!name || p.removed) continue;
      const v = typeof p === 'object' && p.version ? ` (v${p.version})` : '';
      group.append(el('option', { value: 'name:' + name }, name + v));
    }
    if (group.children.length) sel.insertBefore(group, sel.options[1]);
  } catch {
    // No library on this server (404): literal policies only.
  }
}

function togglePolicyJSON() {
  const show = document.getElementById('c-policy').value === '__json__';
  for (const e of document.querySelectorAll('.np')) e.hidden = !show;
}

document.getElementById('c-policy').addEventListener('change', togglePolicyJSON);
togglePolicyJSON();

document.getElementById('create-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const msg = document.getElementById('create-msg');
  clear(msg);
  const f = ev.currentTarget;
  const req = {
    image: { uri: f.image.value.trim() },
    timeout: Number(f.timeout.value),
  };
  const ep = f.entrypoint.value.trim();
  if (ep) req.entrypoint = ep.split(/\s+/);
  const pol = f.policy.value;
  if (pol === '__json__') {
    try {
      req.networkPolicy = JSON.parse(f.networkPolicy.value);
    } catch (e) {
      report(msg, 'Create failed', new Error('the networkPolicy is not valid JSON: ' + e.message));
      f.networkPolicy.focus();
      return;
    }
  } else if (pol.startsWith('name:')) {
    req.extensions = { 'airlock.dev/policy': pol.slice(5) };
  }
  await run(document.getElementById('create-submit'), msg, 'Create', async () => {
    const sb = await api('POST', '/console/api/v1/sandboxes', req);
    note(msg, `Created ${sb.id} (${sb.status?.state ?? 'Pending'}).`);
    await refresh();
  });
});

function policyText(sb) {
  const name = sb.policyName || '—';
  if (sb.policyError) return `${name} (unreadable)`;
  return sb.hasPolicy ? `${name} v${sb.policyVersion}` : `${name} (default)`;
}

function actionsFor(sb, row) {
  const id = sb.id;
  const st = sb.status.state;
  const msg = (text) => note(listMsg, text);
  const btns = [];
  const renew = el('button', { type: 'button', 'data-action': 'renew', 'aria-label': `Renew ${id} by one hour` }, 'Renew 1 h');
  renew.addEventListener('click', () => run(renew, listMsg, `Renew ${id}`, async () => {
    const at = new Date(Date.now() + 3600e3).toISOString();
    const r = await api('POST', `/console/api/v1/sandboxes/${id}/renew-expiration`, { expiresAt: at });
    msg(`${id} now expires ${fmtTime(r.expiresAt)}.`);
    await refresh();
  }));
  btns.push(renew);
  if (st === 'Paused') {
    const b = el('button', { type: 'button', 'data-action': 'resume', 'aria-label': `Resume ${id}` }, 'Resume');
    b.addEventListener('click', () => run(b, listMsg, `Resume ${id}`, async () => {
      await api('POST', `/console/api/v1/sandboxes/${id}/resume`);
      msg(`${id} resumed.`);
      await refresh();
    }));
    btns.push(b);
  } else {
    const b = el('button', { type: 'button', 'data-action': 'pause', 'aria-label': `Pause ${id}` }, 'Pause');
    b.addEventListener('click', () => run(b, listMsg, `Pause ${id}`, async () => {
      await api('POST', `/console/api/v1/sandboxes/${id}/pause`);
      msg(`${id} paused.`);
      await refresh();
    }));
    btns.push(b);
  }
  const del = el('button', { type: 'button', class: 'danger', 'data-action': 'delete', 'aria-label': `Delete ${id}` }, 'Delete');
  let armed = null;
  del.addEventListener('click', () => {
    if (!armed) { // two steps: the first click arms the button for 5 s
      del.textContent = 'Confirm delete';
      del.setAttribute('aria-label', `Confirm: delete ${id}`);
      armed = setTimeout(() => { armed = null; del.textContent = 'Delete'; del.setAttribute('aria-label', `Delete ${id}`); }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    run(del, listMsg, `Delete ${id}`, async () => {
      await api('DELETE', `/console/api/v1/sandboxes/${id}`);
      msg(`${id} deleted.`);
      await refresh();
    });
  });
  btns.push(del);
  return btns;
}

function endpointCell(sb) {
  const id = sb.id;
  const form = el('form', { class: 'inline', 'data-action': 'endpoint' });
  const input = el('input', { type: 'number', min: 1, max: 65535, value: 8080, 'aria-label': `Port of ${id} to open`, class: 'port' });
  const btn = el('button', { type: 'submit' }, 'Get link');
  const out = el('span', { class: 'ep-out' });
  form.append(input, btn, out);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    run(btn, listMsg, `Endpoint of ${id}`, async () => {
      const port = Number(input.value);
      const ep = await api('GET', `/console/api/v1/sandboxes/${id}/endpoints/${port}`);
      const url = endpointURL(ep.endpoint);
      const needs = Object.keys(ep.headers ?? {});
      replace(out, endpointLink(port, url, 'open'),
        needs.length ? el('small', {}, ` needs ${needs.join(', ')}: mint a signed URL on the sandbox's page`) : '');
    });
  });
  return form;
}

function render(data) {
  const now = Date.parse(data.now) || Date.now();
  const seen = new Set();
  data.items.forEach((sb, i) => {
    seen.add(sb.id);
    let row = rows.get(sb.id);
    if (!row) {
      const tr = el('tr', { 'data-id': sb.id });
      const cells = {
        id: el('td', {}, el('a', { href: `/console/sandboxes/${encodeURIComponent(sb.id)}` }, sb.id)),
        state: el('td', { class: 'state' }), image: el('td'), age: el('td'), expires: el('td'), policy: el('td', { class: 'policy' }),
        actions: el('td', { class: 'row-actions' }), endpoint: el('td'),
      };
      tr.append(...Object.values(cells));
      cells.endpoint.append(endpointCell(sb));
      row = { tr, cells, state: null };
      rows.set(sb.id, row);
    }
    const c = row.cells;
    const st = sb.status.state;
    c.state.textContent = st;
    c.state.dataset.state = st;
    c.state.title = sb.status.message || sb.status.reason || '';
    c.image.textContent = sb.image?.uri ?? '—';
    c.age.textContent = fmtDuration(now - Date.parse(sb.createdAt));
    c.expires.textContent = sb.expiresAt ? `in ${fmtDuration(Date.parse(sb.expiresAt) - now)}` : 'never (manual)';
    c.expires.title = sb.expiresAt ? fmtTime(sb.expiresAt) : '';
    c.policy.textContent = policyText(sb);
    if (row.state !== st && !c.actions.contains(document.activeElement)) {
      replace(c.actions, el('div', { class: 'actions' }, actionsFor(sb, row)));
      row.state = st;
    }
    // Keep the API's order (newest first), moving a row only when needed (a moved row
    // would lose the keyboard focus).
    if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] ?? null);
  });
  for (const [id, row] of rows) {
    if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
  }
  document.getElementById('list-empty').hidden = data.items.length > 0;
  document.getElementById('list-count').textContent = `(${data.items.length})`;
}

let failing = false;
async function refresh() {
  try {
    render(await api('GET', '/console/api/sandboxes'));
    if (failing) { clear(listMsg); failing = false; }
  } catch (e) {
    failing = true;
    report(listMsg, 'Listing sandboxes failed', e);
  }
}

const deleted = new URLSearchParams(location.search).get('deleted');
if (deleted) note(listMsg, `${deleted} deleted.`);
loadPolicies();
refresh();
setInterval(refresh, 2000);
