// The API keys page (admins): list principals, create a key (shown once), rotate and
// revoke. Every call goes to the lifecycle API through /console/api/v1/keys, which
// refuses other roles (the refusal is shown).
import { api, el, replace, report, note, run } from './common.js';

const msg = document.getElementById('keys-msg');
const body = document.querySelector('#keys tbody');
const out = document.getElementById('new-key-out');
const outValue = document.getElementById('new-key-value');

function showKey(created) {
  outValue.textContent = created.key;
  out.hidden = false;
}

const when = (t) => (t ? new Date(t).toLocaleString() : '');

async function load() {
  try {
    const { items } = await api('GET', '/console/api/v1/keys');
    replace(body, items.map((k) => el('tr', {},
      el('td', {}, el('code', {}, k.id)), el('td', {}, k.name), el('td', {}, k.role),
      el('td', {}, k.configured ? 'configured' : when(k.createdAt)), el('td', {}, when(k.rotatedAt)),
      el('td', {}, k.configured ? '' : [
        el('button', { type: 'button', onclick: (e) => run(e.target, msg, 'Rotating', async () => {
          showKey(await api('POST', `/console/api/v1/keys/${encodeURIComponent(k.id)}/rotate`));
          note(msg, `Rotated ${k.id}: its old key no longer works.`);
          await load();
        }) }, 'Rotate'),
        ' ',
        el('button', { type: 'button', class: 'danger', onclick: (e) => run(e.target, msg, 'Revoking', async () => {
          if (!confirm(`Revoke the key of ${k.name}? It stops working at once.`)) return;
          await api('DELETE', `/console/api/v1/keys/${encodeURIComponent(k.id)}`);
          note(msg, `Revoked ${k.id}.`);
          await load();
        }) }, 'Revoke'),
      ]))));
  } catch (e) {
    report(msg, 'Listing API keys failed', e);
  }
}

document.getElementById('new-key').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const f = ev.target;
  run(f.querySelector('button'), msg, 'Creating the key', async () => {
    const created = await api('POST', '/console/api/v1/keys', { name: f.name.value, role: f.role.value });
    showKey(created);
    note(msg, `Created ${created.id} (${created.role}).`);
    f.reset();
    await load();
  });
});

load();
