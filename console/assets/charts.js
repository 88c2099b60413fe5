// Small inline SVG charts drawn from /console/api/stats. No library: rects and text.
import { el, svgEl, replace } from './common.js';

const W = 600, H = 70, PAD = 2;

// minuteBars draws one sandbox's decisions per minute: allowed up from the middle line,
// denied down from it, each scaled to the busiest minute of the series. A table of the
// numbers follows in a <details> for screen readers and exact values.
export function minuteBars(s, start, minutes) {
  const max = Math.max(1, ...s.allowed, ...s.denied);
  const bw = (W - 2 * PAD) / minutes;
  const mid = H / 2;
  const sumA = s.allowed.reduce((a, b) => a + b, 0), sumD = s.denied.reduce((a, b) => a + b, 0);
  const label = `${s.sandboxId}: ${sumA} allowed, ${sumD} denied in ${minutes} minutes`;
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, class: 'bars', preserveAspectRatio: 'none' },
    svgEl('title', {}, label),
    svgEl('line', { x1: 0, x2: W, y1: mid, y2: mid, class: 'axis' }));
  for (let i = 0; i < minutes; i++) {
    const t = new Date(Date.parse(start) + i * 60e3).toLocaleTimeString(undefined, { hour12: false, hour: '2-digit', minute: '2-digit' });
    const a = s.allowed[i], d = s.denied[i];
    if (a) {
      const h = Math.max(1, (a / max) * (mid - PAD));
      svg.append(svgEl('rect', { x: PAD + i * bw, y: mid - h, width: Math.max(1, bw - 1), height: h, class: 'allow' },
        svgEl('title', {}, `${t}: ${a} allowed`)));
    }
    if (d) {
      const h = Math.max(1, (d / max) * (mid - PAD));
      svg.append(svgEl('rect', { x: PAD + i * bw, y: mid, width: Math.max(1, bw - 1), height: h, class: 'deny' },
        svgEl('title', {}, `${t}: ${d} denied`)));
    }
  }
  const rows = [];
  for (let i = 0; i < minutes; i++) {
    if (!s.allowed[i] && !s.denied[i]) continue;
    const t = new Date(Date.parse(start) + i * 60e3).toLocaleTimeString(undefined, { hour12: false });
    rows.push(el('tr', {}, el('td', {}, t), el('td', {}, s.allowed[i]), el('td', {}, s.denied[i])));
  }
  const table = el('details', {}, el('summary', {}, 'numbers'),
    el('table', {}, el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Minute'), el('th', { scope: 'col' }, 'Allowed'), el('th', { scope: 'col' }, 'Denied'))),
      el('tbody', {}, rows)));
  const hm = (ms) => new Date(ms).toLocaleTimeString(undefined, { hour12: false, hour: '2-digit', minute: '2-digit' });
  const axis = el('div', { class: 'axis-labels', 'aria-hidden': 'true' },
    el('span', {}, hm(Date.parse(start))), el('span', {}, hm(Date.parse(start) + minutes * 60e3)));
  return el('figure', { class: 'minute-chart', 'data-sandbox': s.sandboxId },
    el('figcaption', {}, el('a', { href: `/console/sandboxes/${encodeURIComponent(s.sandboxId)}` }, s.sandboxId),
      ` · ${sumA} allowed · ${sumD} denied`), svg, axis, table);
}

// topBars draws the most denied destinations as horizontal bars.
export function topBars(items) {
  if (!items.length) return el('p', {}, 'No denied destinations in this window.');
  const max = Math.max(...items.map((x) => x.count));
  const rowH = 22, labelW = 260, w = 600;
  const svg = svgEl('svg', { viewBox: `0 0 ${w} ${items.length * rowH}`, role: 'img', class: 'topn', 'aria-label': 'Most denied destinations' },
    svgEl('title', {}, 'Most denied destinations'));
  items.forEach((x, i) => {
    const bw = Math.max(2, ((w - labelW - 50) * x.count) / max);
    const y = i * rowH;
    svg.append(
      svgEl('text', { x: labelW - 6, y: y + 15, 'text-anchor': 'end', class: 'label' }, x.destination.length > 38 ? x.destination.slice(0, 37) + '…' : x.destination),
      svgEl('rect', { x: labelW, y: y + 4, width: bw, height: rowH - 8, class: 'deny' }, svgEl('title', {}, `${x.destination}: ${x.count} denied`)),
      svgEl('text', { x: labelW + bw + 6, y: y + 15, class: 'value' }, String(x.count)));
  });
  const table = el('details', {}, el('summary', {}, 'numbers'),
    el('table', {}, el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Destination'), el('th', { scope: 'col' }, 'Denied'))),
      el('tbody', {}, items.map((x) => el('tr', {}, el('td', {}, x.destination), el('td', {}, x.count))))));
  return el('figure', { class: 'top-chart' }, svg, table);
}

// drawStats fills container with one minute chart per sandbox.
export function drawMinutes(container, stats) {
  if (!stats.series.length) {
    replace(container, el('p', {}, `No egress decisions in the last ${stats.minutes} minutes.`));
    return;
  }
  replace(container, stats.series.map((s) => minuteBars(s, stats.start, stats.minutes)),
    stats.otherSandboxes ? el('p', {}, `and ${stats.otherSandboxes} quieter sandboxes`) : '');
}
