// The panels drawn from the state: the header's status, the nodes, the passes and the feed.
// The state comes twice a second while things change; each panel keeps a key of what it last
// drew and leaves the DOM alone when that is the same, so a reader's selection, scroll and
// open details survive.
import { $ } from './dom.js';
import { esc, fmt, fmtTime, num, ago } from './format.js';
import { rangeText } from './points.js';
import { sp, ui } from './state.js';

export function renderStatus(s) {
  const st = s.status || {};
  const pos = st.position || {};
  const item = (k, v, bad) => `<div><dt>${k}</dt><dd${bad ? ' class="bad"' : ''}>${v}</dd></div>`;
  let out = item('leader', esc(s.leaderAddress || 'this assigner')) +
    item('term/seq', `${fmt(pos.term)}/${fmt(pos.seq)}`) +
    item('generation', fmt(st.generation)) +
    item('slices', fmt(st.slices)) +
    item('nodes', fmt(st.nodes)) +
    item('imbalance', fmt(st.imbalance, 3)) +
    item('algorithm', esc(st.algorithm || '—')) +
    item('frozen', st.frozen ? 'yes' : 'no', st.frozen) +
    item('pass failures', fmt(st.passFailures), num(st.passFailures) > 0);
  if (num(st.handoffs)) out += item('handoffs', fmt(st.handoffs));
  if (st.passError) out += item('pass error', esc(st.passError), true);
  if (st.sourceError) out += item('source error', esc(st.sourceError) + (st.sourceMisconfigured ? ' (misconfigured)' : ''), true);
  if ((st.quarantined || []).length) out += item('quarantined', String(st.quarantined.length), true);
  const h = s.history || {};
  if (h.columns) out += item('history', `${fmt(h.columns)} of ${fmt(h.capacity)} passes · ${fmt(num(h.bytes) / 1048576, 1)} MiB`);
  $('status').innerHTML = out;
}

const STATES = new Set(['serving', 'loading', 'draining', 'stale', 'quarantined']);
let nodesHTML = '', nodeIDs = '';
export function renderNodes(s) {
  const nodes = s.nodes || [];
  const states = s.nodeStates || {};
  const rows = [];
  // Loads are over capacity, in the units the nodes report: the bars compare the nodes.
  const top = Math.max(1e-9, ...nodes.map((n) => num(n.load)));
  for (const n of nodes) {
    const id = (n.node && n.node.id) || n.id || '';
    const zone = (s.zones || {})[id] || '';
    const cap = num(n.node && n.node.capacity) || 1;
    const load = num(n.load);
    const pct = Math.max(0, Math.min(100, 100 * load / top));
    let state = states[id];
    if (!STATES.has(state)) state = n.draining ? 'draining' : n.stale ? 'stale' : num(n.loading) > 0 ? 'loading' : 'serving';
    rows.push(`<tr><td>${esc(id)}</td><td>${esc(zone)}</td>` +
      `<td title="load over capacity (capacity ${fmt(cap, 2)}); the bar is against the most loaded node"><span class="bar"><i style="width:${pct.toFixed(1)}%"></i></span>${fmt(load, 2)}</td>` +
      `<td class="num">${fmt(cap, 2)}</td>` +
      `<td class="num">${fmt(n.slices)}</td><td class="num">${fmt(n.primaries)}</td><td class="num">${fmt(n.loading)}</td>` +
      `<td><span class="st st-${state}">${state}</span></td><td title="${esc(n.lastSeen)}">${esc(ago(n.lastSeen))}</td></tr>`);
  }
  const html = rows.join('');
  if (html !== nodesHTML) { $('nodes-body').innerHTML = html; nodesHTML = html; }
  $('nodes-count').textContent = `(${nodes.length})`;
  // The role-mode node selector follows the membership.
  const ids = nodes.map((n) => (n.node && n.node.id) || n.id || '').sort();
  const joined = ids.join('\n');
  if (joined !== nodeIDs) {
    nodeIDs = joined;
    const sel = $('node-select');
    const keep = ui.node;
    sel.innerHTML = '<option value="">(none: primary or not)</option>' +
      ids.map((id) => `<option value="${esc(id)}">${esc(id)}</option>`).join('');
    sel.value = ids.includes(keep) ? keep : '';
  }
}

let passesKey = '';
// Only what the reader opened or closed sticks across updates; otherwise the newest is open.
const userOpen = new Map();
$('explain').addEventListener('click', (e) => {
  const sum = e.target.closest('summary');
  if (sum) userOpen.set(sum.parentElement.dataset.key, !sum.parentElement.open);
});
export function renderPasses(passes, st = {}) {
  const key = JSON.stringify([passes, st.passFailures, st.passError]);
  if (key === passesKey) return;
  passesKey = key;
  const el = $('explain');
  // The passes listed are those that succeeded; a run of failures since is only counted.
  const failing = num(st.passFailures) > 0
    ? `<p class="err">${fmt(st.passFailures)} failed pass${num(st.passFailures) === 1 ? '' : 'es'} in a row` +
      `${st.passError ? `: ${esc(st.passError)}` : ''}${st.passErrorTime ? ` (${esc(ago(st.passErrorTime))})` : ''}</p>` : '';
  if (!passes.length) { el.innerHTML = failing + '<p class="k">no pass yet</p>'; return; }
  el.innerHTML = failing + passes.map((p, i) => {
    const pos = p.position || {};
    const k = `${fmt(pos.term)}.${fmt(pos.seq)}`;
    const open = userOpen.has(k) ? userOpen.get(k) : i === 0;
    const cands = p.candidates || [];
    const rows = cands.slice(0, 200).map((c) => `<tr class="${c.chosen ? 'chosen' : 'refused'}"><td>${c.chosen ? '✓' : '✗'}</td>` +
      `<td>${esc(c.action)}</td><td class="mono">${rangeText(c.slice)}</td><td>${esc(c.from)} → ${esc((c.to || []).join(', '))}</td>` +
      `<td class="num">${fmt(c.gain, 3)}</td><td class="num">${fmt(c.cost, 3)}</td><td>${c.chosen ? 'chosen' : esc(c.reason || 'refused')}</td></tr>`).join('');
    return `<details data-key="${esc(k)}"${open ? ' open' : ''}><summary>` +
      `<b>#${esc(k)}</b> ${esc(p.time ? fmtTime(Date.parse(p.time)) : '')} · ${esc(p.algorithm || '')} · ` +
      `imbalance ${fmt(p.imbalanceBefore, 3)}→${fmt(p.imbalanceAfter, 3)} · churn ${fmt(p.churnMove, 3)}/${fmt(p.churnBudget, 3)} · ` +
      `${fmt(p.moves)} moves, ${fmt(p.splits)} splits, ${fmt(p.merges)} merges` +
      (p.stop ? ` · stop: ${esc(p.stop)}` : '') +
      (p.passError ? ` <span class="err">· failed ${fmt(p.passFailures)}×: ${esc(p.passError)}</span>` : '') +
      '</summary>' +
      (cands.length ? `<table><thead><tr><th></th><th>action</th><th>slice</th><th>from → to</th><th>gain</th><th>cost</th><th>outcome</th></tr></thead><tbody>${rows}</tbody></table>` +
        (cands.length > 200 ? `<p class="k">+${cands.length - 200} more candidates</p>` : '') : '<p class="k">no candidates</p>') +
      '</details>';
  }).join('');
}

let feedKey = '';
export function renderFeed(quanta) {
  const key = quanta.length ? `${quanta.length}|${quanta[0].term}.${quanta[0].seq}|${quanta[quanta.length - 1].seq}` : '0';
  if (key === feedKey) return;
  feedKey = key;
  $('feed').innerHTML = quanta.map((q) => {
    const ops = q.ops || [];
    const shown = ops.slice(0, 3).map(esc).join('<br>') + (ops.length > 3 ? `<br>+${ops.length - 3} more` : '');
    const by = String(q.by || '');
    return `<li data-seq="${esc(q.seq)}" data-cause="${esc(q.cause)}"><div class="head">` +
      `<span class="seq" title="term ${esc(q.term)}, generation ${esc(q.generation)}">#${esc(q.seq)}</span><span class="time">${esc(fmtTime(Date.parse(q.time)))}</span>` +
      `<span class="cause">${esc(q.cause)}</span><span class="by" title="${esc(by)}">${esc(by.replace(/^spiffe:\/\/[^/]+\//, ''))}</span>` +
      `</div><div class="ops" title="${esc(ops.join('\n'))}">${shown}</div></li>`;
  }).join('');
  sp.feedCount = quanta.length;
  $('feed-count').textContent = `(${quanta.length})`;
}
