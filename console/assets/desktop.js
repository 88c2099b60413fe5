// The desktop section of a sandbox's page: noVNC of a desktop sandbox (airlock/desktop)
// embedded through the gateway under a short-lived signed URL the console mints with the
// session's key, and a screenshot of the whole display taken inside the sandbox.
import { api, csrfToken, report, note, clear, run, fmtTime, APIError } from './common.js';

const q = (s) => document.getElementById(s);
const id = decodeURIComponent(location.pathname.split('/').pop());
const base = `/console/api/sandboxes/${encodeURIComponent(id)}`;
const msg = q('desktop-msg');

// show mints a live-desktop link and loads noVNC (it connects at once) in the frame.
async function show(button) {
  clear(msg);
  await run(button, msg, 'Opening the desktop', async () => {
    const link = await api('GET', `${base}/desktop`);
    q('desktop-frame').src = link.url;
    q('desktop-view').hidden = false;
    note(msg, `Live through the gateway; the link expires ${fmtTime(link.expiresAt)} (an open session stays).`);
  });
}

// screenshot asks the console for a PNG of the display and shows it.
async function screenshot(button) {
  clear(msg);
  await run(button, msg, 'Screenshot', async () => {
    const r = await fetch(`${base}/screenshot`, {
      method: 'POST', credentials: 'same-origin', cache: 'no-store',
      headers: { 'X-CSRF-Token': csrfToken, Accept: 'image/png' },
    });
    if (!r.ok) {
      const data = await r.json().catch(() => ({}));
      throw new APIError(r.status, data.code ?? 'HTTP_' + r.status, data.message ?? `${r.status} ${r.statusText}`);
    }
    const blob = await r.blob();
    const url = await new Promise((resolve, reject) => {
      const fr = new FileReader();
      fr.onload = () => resolve(fr.result);
      fr.onerror = () => reject(fr.error);
      fr.readAsDataURL(blob);
    });
    q('desktop-shot-img').src = url;
    q('desktop-shot-time').textContent = `taken ${fmtTime(new Date().toISOString())}`;
    q('desktop-shot-out').hidden = false;
  });
}

q('desktop-show').addEventListener('click', (e) => show(e.currentTarget));
q('desktop-shot').addEventListener('click', (e) => screenshot(e.currentTarget));

// A sandbox from the desktop image opens its desktop by itself.
api('GET', `/console/api/v1/sandboxes/${encodeURIComponent(id)}`).then((sb) => {
  if (/(^|\/)(airlock|opensandbox)\/desktop(:|@|$)/.test(sb.image?.uri ?? '')) show(q('desktop-show'));
}).catch((e) => report(msg, 'Reading the sandbox failed', e));
