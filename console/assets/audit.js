// The audit page: chain verification, charts, search with paging, JSON Lines export.
import { api, el, replace, report, note, clear, run, fromLocalInput, toLocalInput } from './common.js';
import { drawMinutes, topBars } from './charts.js';

const q = (s) => document.getElementById(s);

async function verify() {
  const out = q('verify-status');
  out.textContent = 'checking…';
  out.className = '';
  try {
    const v = await api('GET', '/console/api/audit/verify');
    const r = v.report ?? {};
    if (v.ok) {
      out.className = 'ok';
      out.textContent = `Chain verified: ${r.records} records (seq ${r.first_seq}–${r.last_seq}) in ${r.files} files, ` +
        `${r.checkpoints} checkpoints, ${r.lost} lost` + (r.torn_tail ? `; torn tail at ${r.torn_tail.file}:${r.torn_tail.line}` : '') +
        (r.unverified_signatures ? `; ${r.unverified_signatures} signatures not checked` : '') + '.';
    } else if (r.broken) {
      out.className = 'error';
      out.textContent = `BROKEN at ${r.broken.file} line ${r.broken.line} (seq ${r.broken.seq}): ${r.broken.reason}`;
    } else {
      out.className = 'error';
      out.textContent = 'Verification failed: ' + (v.error ?? 'unknown error');
    }
    out.dataset.ok = String(!!v.ok);
  } catch (e) {
    report(out, 'Verification failed', e);
  }
}
q('verify-again').addEventListener('click', (e) => run(e.currentTarget, q('verify-status'), 'Verification', verify));

async function charts() {
  const msg = q('charts-msg');
  try {
    const s = await api('GET', `/console/api/stats?minutes=${q('ch-minutes').value}`);
    clear(msg);
    drawMinutes(q('minute-charts'), s);
    replace(q('top-denied'), topBars(s.topDenied));
  } catch (e) {
    report(msg, 'Reading the statistics failed', e);
  }
}
q('charts-form').addEventListener('submit', (e) => { e.preventDefault(); charts(); });

function params() {
  const f = q('search-form');
  const p = new URLSearchParams({
    sandbox: f.sandbox.value.trim(), since: fromLocalInput(f.since.value), until: fromLocalInput(f.until.value),
    action: f.action.value, source: f.source.value, principal: f.principal.value.trim(),
  });
  for (const [k, v] of [...p]) if (!v) p.delete(k);
  return p;
}

function dest(r) {
  // A control-plane call or an agent action: what was done, to what, by whom.
  const x = r.extra ?? {};
  if (x.op) {
    const what = x.target ?? x.command ?? x.code ?? x.path ?? '';
    return `${x.op}${what ? ' ' + what : ''}${x.status ? ' → ' + x.status : ''}${x.principal ? ' by ' + x.principal : ''}`;
  }
  if (r.dst_host) return r.dst_host + (r.dst_port ? ':' + r.dst_port : '');
  if (r.dst_ip) return r.dst_ip + (r.dst_port ? ':' + r.dst_port : '');
  return '';
}

let after = 0, shown = 0;
async function search(more) {
  const msg = q('search-msg');
  clear(msg);
  const p = params();
  p.set('limit', '100');
  if (more) p.set('after', String(after));
  const tbody = q('results').querySelector('tbody');
  await run(more ? q('more') : q('search-submit'), msg, 'Search', async () => {
    const res = await api('GET', '/console/api/audit?' + p);
    if (!more) { replace(tbody); shown = 0; }
    for (const r of res.records) {
      tbody.append(el('tr', { 'data-seq': r.seq, class: 'rec-' + r.action },
        el('td', {}, r.seq), el('td', {}, new Date(r.time).toLocaleString(undefined, { hour12: false })),
        el('td', {}, r.sandbox_id ? el('a', { href: `/console/sandboxes/${encodeURIComponent(r.sandbox_id)}` }, r.sandbox_id) : '—'),
        el('td', {}, r.source), el('td', { class: 'act-' + r.action }, r.action), el('td', {}, dest(r)),
        el('td', {}, r.rule ?? ''), el('td', {}, r.reason ?? '')));
      after = r.seq;
    }
    shown += res.records.length;
    q('search-count').textContent = `${shown} records${res.more ? ' (more available)' : ''}`;
    q('more').hidden = !res.more;
  });
}
q('search-form').addEventListener('submit', (e) => { e.preventDefault(); search(false); });
q('more').addEventListener('click', () => search(true));

// Export: a plain navigation to the export route, which answers as a download.
q('export').addEventListener('click', () => {
  const a = el('a', { href: '/console/api/audit/export?' + params(), download: '' });
  document.body.append(a);
  a.click();
  a.remove();
  note(q('search-msg'), 'Export started: the matching records download as JSON Lines.');
});

// Defaults: the last hour.
const now = new Date();
q('s-since').value = toLocalInput(new Date(now - 3600e3));
const sb = new URLSearchParams(location.search).get('sandbox');
if (sb) q('s-sandbox').value = sb;
verify();
charts();
search(false);
setInterval(charts, 30000);
