// Shared by every console page: the API client (CSRF header, error envelope, session
// expiry), small DOM helpers and formatting. No framework: plain DOM.

const meta = (name) => document.querySelector(`meta[name="${name}"]`)?.content ?? '';
export const csrfToken = meta('csrf-token');
export const endpointScheme = meta('endpoint-scheme') || 'http';
export const defaultImage = meta('default-image');

// APIError carries the API's {code, message} envelope.
export class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function toLogin(expired) {
  const q = new URLSearchParams({ next: location.pathname });
  if (expired) q.set('expired', '1');
  location.assign('/console/login?' + q);
}

// api calls the console API. Writes carry the CSRF token. A non-2xx answer throws an
// APIError with the server's message; an expired session goes to the login page.
export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const opts = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrfToken;
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    opts.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, opts);
  } catch (e) {
    throw new APIError(0, 'NETWORK', 'the console server did not answer: ' + e.message);
  }
  const text = await r.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!r.ok) {
    const code = data?.code ?? 'HTTP_' + r.status;
    const message = data?.message ?? `${r.status} ${r.statusText}`;
    if (r.status === 401 && (code === 'SESSION_EXPIRED' || code === 'UNAUTHORIZED')) toLogin(code === 'SESSION_EXPIRED');
    throw new APIError(r.status, code, message);
  }
  return data;
}

// el builds an element: el('button', {type: 'button', onclick: f}, 'Text', child...).
// Strings become text nodes (never HTML).
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// replace empties e and appends children.
export function replace(e, ...children) {
  e.replaceChildren();
  append(e, children);
}

// svgEl builds an SVG element.
export function svgEl(tag, attrs = {}, ...children) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  append(e, children);
  return e;
}

// report shows err (an APIError or any error) in the region: role=alert, so screen
// readers announce it. prefix says what failed.
export function report(region, prefix, err) {
  region.hidden = false;
  region.classList.remove('ok');
  region.classList.add('error');
  region.setAttribute('role', 'alert');
  const code = err instanceof APIError && err.code ? ` (${err.code})` : '';
  region.textContent = `${prefix}: ${err.message}${code}`;
}

// note shows a success message in the region (role=status).
export function note(region, text) {
  region.hidden = false;
  region.classList.remove('error');
  region.classList.add('ok');
  region.setAttribute('role', 'status');
  region.textContent = text;
}

export function clear(region) {
  region.hidden = true;
  region.textContent = '';
}

// run disables button while fn runs and reports a failure in region.
export async function run(button, region, what, fn) {
  if (button) button.disabled = true;
  try {
    return await fn();
  } catch (e) {
    report(region, what + ' failed', e);
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}

export function fmtDuration(ms) {
  const s = Math.round(Math.abs(ms) / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

// endpointURL turns an API endpoint (host[:port]/path, no scheme) into a URL.
export function endpointURL(ep) {
  return /^[a-z]+:\/\//.test(ep) ? ep : `${endpointScheme}://${ep}`;
}

// Control ports (opensandbox.IsControlPort): execd and the egress API. Their URLs are for
// SDKs and curl; the console never opens them in the browser, it only offers to copy them
// (a signed execd URL runs commands, and a browser tab is where a sandbox's page could
// reach it).
const controlPorts = new Set([44772, 18080]);
export function isControlPort(port) {
  return controlPorts.has(Number(port));
}

// endpointLink is a link that opens url, or for a control port the URL as text with a
// Copy button (copy only).
export function endpointLink(port, url, text = url) {
  if (!isControlPort(port)) return el('a', { href: url, target: '_blank', rel: 'noopener noreferrer' }, text);
  const code = el('code', { class: 'copy-only' }, url);
  const btn = el('button', { type: 'button', 'aria-label': 'Copy URL' }, 'Copy');
  btn.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(url);
      btn.textContent = 'Copied';
    } catch {
      getSelection().selectAllChildren(code); // no clipboard access: select it for Ctrl+C
    }
  });
  return el('span', {}, code, ' ', btn, ' ', el('small', {}, '(copy only: for an SDK or curl, never opened here)'));
}

// fromLocalInput converts a datetime-local value to RFC 3339 (UTC), '' when empty.
export function fromLocalInput(v) {
  if (!v) return '';
  const d = new Date(v);
  return isNaN(d) ? '' : d.toISOString();
}

// toLocalInput formats a Date for a datetime-local input.
export function toLocalInput(d) {
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

export const pageError = document.getElementById('page-error');

document.getElementById('logout')?.addEventListener('click', async (ev) => {
  await run(ev.currentTarget, pageError, 'Sign-out', async () => {
    await api('POST', '/console/logout');
    location.assign('/console/login?out=1');
  });
});
