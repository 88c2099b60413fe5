// A sandbox's pending policy proposal: its refusals (denied and would-deny) since the
// last decision, on top of its policy (GET /v1/sandboxes/{id}/policy/proposal, through
// the console's API pass-through). An operator approves it (applied to the sandbox, or
// with a "save as" name written into the policy library as that named policy, which
// the sandbox then runs under) or rejects it; the API audits either with the
// operator's principal and keeps the decision across restarts.
import { api, el, replace, report, note, clear, run } from './common.js';

export function initProposal(id) {
  const q = (s) => document.getElementById(s);
  const path = `/console/api/v1/sandboxes/${encodeURIComponent(id)}/policy/proposal`;
  const msg = q('proposal-msg');
  let current = null;

  async function load() {
    clear(msg);
    try {
      current = await api('GET', path);
    } catch (e) {
      current = null;
      replace(q('proposal-out'));
      report(msg, 'Reading the proposal failed', e);
      return;
    }
    const p = current;
    q('proposal-approve').disabled = q('proposal-reject').disabled = !p.pending;
    const rules = (p.rules ?? []).filter((r) => r.new);
    replace(q('proposal-out'),
      el('p', { id: 'proposal-status' }, p.pending
        ? `Pending: ${rules.length} rule(s) would allow what the sandbox was refused.`
        : 'Nothing pending: the policy allows everything the sandbox did since the last decision.'),
      p.lastDecision ? el('p', { id: 'proposal-last' }, el('small', {},
        `Last decision: ${p.lastDecision.decision === 'approve' ? 'approved' : 'rejected'}` +
        (p.lastDecision.principal ? ` by ${p.lastDecision.principal}` : '') +
        ` at ${new Date(p.lastDecision.at).toLocaleString(undefined, { hour12: false })}` +
        (p.lastDecision.savedAs ? `, saved as library policy ${p.lastDecision.savedAs}` : '') + '.')) : '',
      rules.length ? el('table', {},
        el('caption', {}, 'Proposed rules (added first)'),
        el('thead', {}, el('tr', {}, ['Rule', 'Target', 'Scope', 'Seen', 'Refused', 'HTTP'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, rules.map((r) => el('tr', {},
          el('td', {}, r.rule), el('td', {}, el('code', {}, r.target)), el('td', {}, r.scope),
          el('td', {}, String(r.seen)), el('td', {}, String(r.refused)),
          el('td', {}, (r.http ?? []).map((h) => `${h.methods.join(',')} ${h.path}`).join('; ')))))) : '',
      p.pending ? el('details', {}, el('summary', {}, 'Proposed policy (YAML)'), el('pre', { id: 'proposal-yaml' }, p.yaml)) : '');
  }

  async function decide(decision, button) {
    if (!current) return;
    const saveAs = decision === 'approve' ? q('proposal-save-as').value.trim() : '';
    const body = { decision, digest: current.digest };
    if (saveAs) Object.assign(body, { saveAs, replace: q('proposal-replace').checked });
    const done = await run(button, msg, decision === 'approve' ? 'Approve' : 'Reject', async () => {
      await api('POST', path, body);
      return true;
    });
    if (!done) return;
    await load();
    note(msg, decision !== 'approve' ? 'Rejected.'
      : saveAs ? `Approved: saved in the policy library as ${saveAs}; the sandbox runs under it.`
        : 'Approved: the proposed policy is applied to the sandbox.');
    if (saveAs) q('proposal-save-as').value = '';
    document.dispatchEvent(new CustomEvent('airlock:policy-changed'));
  }

  q('proposal-refresh').addEventListener('click', load);
  q('proposal-approve').addEventListener('click', () => decide('approve', q('proposal-approve')));
  q('proposal-reject').addEventListener('click', () => decide('reject', q('proposal-reject')));
  load();
}
