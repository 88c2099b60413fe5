// A browser sandbox's page: the pages its Chromium has open (DevTools' /json/list,
// read by the console server through lifecycle's server proxy with the sandbox's
// credential: GET /console/api/sandboxes/{id}/browser) and their hosts, refreshed every
// 2 s next to the live egress audit stream. The section stays hidden for a sandbox
// whose port 9222 does not answer DevTools; after a minute without an answer the page
// stops asking.
import { api, el, replace, report, clear } from './common.js';

const id = decodeURIComponent(location.pathname.split('/').pop());
const q = (s) => document.getElementById(s);
const card = q('browser-card');
const msg = q('browser-msg');
let seen = false; // DevTools answered once: from then on, say when it does not
const giveUp = Date.now() + 60_000;

async function loadPages() {
  try {
    const v = await api('GET', `/console/api/sandboxes/${encodeURIComponent(id)}/browser`);
    if (!v.available) {
      if (seen) report(msg, 'Open pages', new Error(v.message));
    } else {
      seen = true;
      card.hidden = false;
      clear(msg);
      replace(q('browser-hosts'), v.hosts.length ? `Hosts: ${v.hosts.join(', ')}.` : 'No page has a host yet.');
      replace(q('browser-pages').tBodies[0], v.pages.map((p) =>
        el('tr', { 'data-host': p.host },
          el('td', {}, p.type), el('td', {}, p.title || '—'), el('td', {}, p.host || '—'), el('td', {}, el('code', {}, p.url)))));
    }
  } catch (e) {
    if (seen) report(msg, 'Open pages', e);
    if (e.status === 404) return; // the sandbox is gone
  }
  if (seen || Date.now() < giveUp) setTimeout(loadPages, 2000);
}
loadPages();
