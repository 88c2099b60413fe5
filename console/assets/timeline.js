// The sandbox page's timeline: each command run through execd, followed by the flows
// and DNS answers it opened (GET /console/api/sandboxes/{id}/timeline).
import { api, el, replace, report, fmtTime } from './common.js';

const id = decodeURIComponent(location.pathname.split('/').pop());
const q = (s) => document.getElementById(s);

function flowText(f) {
  if (f.source === 'dns') return `DNS ${f.qtype ?? ''} ${f.dst_host ?? ''} ${(f.extra?.answers ?? []).join(', ')}`;
  const dst = (f.dst_host || f.dst_ip || '') + (f.dst_port ? ':' + f.dst_port : '');
  const proc = f.extra?.process?.exe ?? f.extra?.process?.cmdline ?? '';
  return `${f.proto ?? ''} → ${dst}${proc ? ' (' + proc + ')' : ''}`;
}

function commandText(c) {
  const x = c.extra ?? {};
  const text = x.command ?? x.code ?? (x.command_sha256 ? 'sha256:' + x.command_sha256.slice(0, 12) : x.op);
  const exit = x.exit_code !== undefined ? ` exit ${x.exit_code}` : '';
  return `${x.op}: ${text}${exit}${x.principal ? ' · by ' + x.principal : ''}`;
}

async function load() {
  const status = q('timeline-status');
  try {
    const t = await api('GET', `/console/api/sandboxes/${encodeURIComponent(id)}/timeline`);
    const items = t.entries.map((e) => el('li', { class: 'timeline-command', 'data-seq': e.command.seq },
      el('div', {}, el('time', { datetime: e.command.time }, fmtTime(e.command.time)), ' ', el('code', {}, commandText(e.command)),
        ' ', el('span', { class: 'hint' }, `${e.flows.length} connections, linked by ${e.linkedBy}`)),
      el('ul', {}, ...e.flows.map((f) => el('li', { class: 'rec-' + f.action, 'data-seq': f.seq },
        el('span', { class: 'act-' + f.action }, f.action), ' ', flowText(f))))));
    replace(q('timeline'), ...items);
    status.textContent = `${t.entries.length} commands; ${t.unlinked} flows outside any command`;
  } catch (e) {
    report(status, 'Reading the timeline failed', e);
  }
}
q('timeline-refresh').addEventListener('click', load);
load();
