// The sandbox page's terminal: an execd PTY session (execd-pty.md) drawn by xterm.js
// (assets/xterm, vendored by console/thirdparty/xterm.sh). The browser talks to the
// console only: POST …/pty opens a session, the WebSocket …/pty/{sid}/ws carries it
// (the console opens it upstream with the session's credential), DELETE …/pty/{sid}
// ends it. Frames (execd-pty.md §3): binary 0x01 output, 0x03 replay (8-byte big-endian
// offset, then bytes); stdin is binary 0x00 + bytes; resize and signals are JSON text
// frames; JSON "exit" ends the shell. A dropped connection reconnects with since= (the
// bytes already shown) and takeover=1, so nothing is lost or shown twice.
import { Terminal } from './xterm/xterm.mjs';
import { FitAddon } from './xterm/addon-fit.mjs';
import { api, report, clear, csrfToken } from './common.js';

const q = (s) => document.getElementById(s);
const id = decodeURIComponent(location.pathname.split('/').pop());
const base = `/console/api/sandboxes/${encodeURIComponent(id)}/pty`;
const msg = q('term-msg');
const status = q('term-status');
const openBtn = q('term-open');
const closeBtn = q('term-close');
const intBtn = q('term-int');
const box = q('terminal');

const enc = new TextEncoder();
let term = null;
let fit = null;
let ws = null;
let sid = '';
let offset = 0; // bytes of output shown so far (the next since=)
let retries = 0;
let ended = false;

// xterm.js 6's DOM renderer styles itself (theme colours, font, cell size, scrollbar)
// with <style> elements, which the console's CSP (style-src 'self', no 'unsafe-inline')
// does not apply. Their text is mirrored into constructed style sheets
// (document.adoptedStyleSheets, CSSOM), which CSP allows, as xterm.js's own fix for
// strict CSPs did (xtermjs/xterm.js#4611).
const mirrored = new Map(); // <style> element → its CSSStyleSheet
function mirrorStyles() {
  let changed = false;
  for (const [st, sheet] of mirrored) {
    if (!st.isConnected) { mirrored.delete(st); changed = true; sheet.replaceSync(''); }
  }
  for (const st of box.querySelectorAll('style')) {
    let sheet = mirrored.get(st);
    if (!sheet) { sheet = new CSSStyleSheet(); sheet.text = null; mirrored.set(st, sheet); changed = true; }
    if (sheet.text !== st.textContent) { sheet.replaceSync(st.textContent); sheet.text = st.textContent; }
  }
  if (changed) {
    const others = document.adoptedStyleSheets.filter((s) => !('text' in s));
    document.adoptedStyleSheets = [...others, ...mirrored.values()];
  }
}
new MutationObserver(mirrorStyles).observe(box, { subtree: true, childList: true, characterData: true });

function setStatus(text, live) {
  status.textContent = text;
  if (live) status.dataset.live = ''; else delete status.dataset.live;
}

function send(frame) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(frame);
}

function sendResize() {
  if (term) send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
}

function connect(resume) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const qs = resume ? `?since=${offset}&takeover=1` : '';
  ws = new WebSocket(`${scheme}//${location.host}${base}/${encodeURIComponent(sid)}/ws${qs}`);
  ws.binaryType = 'arraybuffer';
  const sock = ws;
  sock.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      let f;
      try { f = JSON.parse(ev.data); } catch { return; }
      if (f.type === 'connected') {
        retries = 0;
        setStatus(`connected (session ${f.session_id})`, true);
        sendResize();
      } else if (f.type === 'exit') {
        ended = true;
        setStatus(`the shell exited with code ${f.exit_code}`, false);
        term.write(`\r\n[exited with code ${f.exit_code}]\r\n`);
      } else if (f.type === 'error') {
        report(msg, 'Terminal', new Error(`${f.error} (${f.code})`));
      }
      return;
    }
    const b = new Uint8Array(ev.data);
    if (b.length === 0) return;
    if (b[0] === 0x03 && b.length >= 9) {
      const from = Number(new DataView(ev.data, 1, 8).getBigUint64(0));
      const data = b.subarray(9);
      // Only the bytes past what is already on screen.
      const skip = Math.max(0, offset - from);
      if (skip < data.length) term.write(data.subarray(skip));
      offset = Math.max(offset, from + data.length);
    } else if (b[0] === 0x01 || b[0] === 0x02) {
      term.write(b.subarray(1));
      offset += b.length - 1;
    }
  };
  sock.onclose = (ev) => {
    if (sock !== ws) return;
    if (ended) { finish(); return; }
    if (ev.code === 4001) {
      setStatus('taken over by another client', false);
      finish();
      return;
    }
    if (retries < 5) {
      retries++;
      setStatus(`disconnected (${ev.code}); reconnecting…`, false);
      setTimeout(() => { if (sid && !ended) connect(true); }, 300 * retries);
      return;
    }
    setStatus('disconnected', false);
    report(msg, 'Terminal', new Error(`the connection closed (${ev.code} ${ev.reason || ''})`));
    finish();
  };
}

// finish leaves the terminal on screen (read-only) and offers a new one.
function finish() {
  ws = null;
  openBtn.hidden = false;
  closeBtn.hidden = true;
  intBtn.hidden = true;
  if (term) term.options.disableStdin = true;
}

async function open() {
  clear(msg);
  openBtn.disabled = true;
  try {
    const r = await api('POST', base, { cwd: '/' });
    sid = r.session_id;
  } catch (e) {
    report(msg, 'Opening a terminal failed', e);
    openBtn.disabled = false;
    return;
  } finally {
    openBtn.disabled = false;
  }
  if (term) term.dispose();
  box.hidden = false;
  term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 14, scrollback: 5000 });
  fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  term.onData((d) => {
    const p = enc.encode(d);
    const f = new Uint8Array(p.length + 1);
    f.set(p, 1);
    send(f);
  });
  term.onResize(sendResize);
  offset = 0;
  retries = 0;
  ended = false;
  openBtn.hidden = true;
  closeBtn.hidden = false;
  intBtn.hidden = false;
  setStatus('connecting…', false);
  connect(false);
  term.focus();
}

async function close() {
  const s = sid;
  ended = true;
  if (ws) ws.close(1000, 'closed by the user');
  finish();
  sid = '';
  setStatus('closed', false);
  if (s) {
    try { await api('DELETE', `${base}/${encodeURIComponent(s)}`); } catch (e) { if (e.status !== 404) report(msg, 'Closing the terminal failed', e); }
  }
}

// Leaving the page ends its session (sessions count against the sandbox's cap, execd's
// --max-pty-sessions); keepalive lets the DELETE outlive the page.
window.addEventListener('pagehide', () => {
  if (!sid || ended) return;
  fetch(`${base}/${encodeURIComponent(sid)}`, { method: 'DELETE', keepalive: true, credentials: 'same-origin',
    headers: { 'X-CSRF-Token': csrfToken } }).catch(() => {});
});
openBtn.addEventListener('click', open);
closeBtn.addEventListener('click', close);
intBtn.addEventListener('click', () => { send(JSON.stringify({ type: 'signal', signal: 'SIGINT' })); term?.focus(); });
window.addEventListener('resize', () => { if (fit && term) fit.fit(); });
