// The tooltip of the cell under the mouse. The grid says what a pixel shows; the slice
// behind it is asked of the server, one request at a time, the newest wanted winning, so
// that sweeping the mouse does not queue a request a pixel.
import { boxPoint, tooltip } from './dom.js';
import { getJSON } from './api.js';
import { esc, fmt, fmtDateTime, num } from './format.js';
import { TWO64, hexToBig, hiToBig, bigToHex, bigFrac, pointAt } from './points.js';
import { sp } from './state.js';
import { MARKS } from './colours.js';
import { columnOf } from './raster.js';

let hover = null;           // {seq, at (BigInt), ...} under the mouse
let cellWant = null;        // the newest cell request not yet sent
let cellBusy = false;
let lastCell = null;

// hoverAt shows what is under the mouse; the caller does not call it during a drag.
export function hoverAt(ev) {
  const g = sp.lastGrid;
  if (!g || !g.seqs.length) return;
  const p = boxPoint(ev);
  const c = Math.min(g.w - 1, Math.floor((p.x / p.w) * g.w));
  const r = Math.min(g.h - 1, Math.floor((p.y / p.h) * g.h));
  const lo = hexToBig(g.lo), hi = hiToBig(g.hi);
  const rlo = pointAt(lo, hi, r / g.h), rhi = r === g.h - 1 ? hi : pointAt(lo, hi, (r + 1) / g.h);
  const at = pointAt(lo, hi, p.y / p.h);
  const k = c * g.h + r;
  hover = { seq: g.seqs[c], time: g.times ? g.times[c] : 0, at, rlo, rhi, c, p, g, k };
  renderTooltip();
  if (lastCell && lastCell.seq === hover.seq && cellCovers(lastCell, at)) return;
  cellWant = { seq: hover.seq, at };
  pumpCell();
}
export function hideTooltip() { hover = null; cellWant = null; tooltip.hidden = true; }
function cellCovers(cell, at) {
  try { return hexToBig(cell.lo) <= at && at < hiToBig(cell.hi); } catch (e) { return false; }
}
async function pumpCell() {
  if (cellBusy) return; // the one in flight picks up cellWant when it ends
  while (cellWant) {
    const w = cellWant;
    cellWant = null;
    cellBusy = true;
    try {
      const cell = await getJSON(`api/cell?seq=${w.seq}&at=${bigToHex(w.at)}`);
      lastCell = cell;
      if (hover && hover.seq === cell.seq && cellCovers(cell, hover.at)) renderTooltip();
    } catch (e) {
      lastCell = null;
      if (hover && hover.seq === w.seq) { hover.cellError = e.message; renderTooltip(); }
    } finally {
      cellBusy = false;
    }
  }
}
function renderTooltip() {
  const h = hover;
  if (!h) return;
  const g = h.g;
  let s = `<div><span class="k">seq</span> ${h.seq} · ${esc(fmtDateTime(h.time))}</div>` +
    `<div class="mono">[${bigToHex(h.rlo)}, ${h.rhi >= TWO64 ? '2^64' : bigToHex(h.rhi)})</div>`;
  const hd = g.holder ? g.holder[h.k] : -1;
  if (g.load) s += `<div><span class="k">load/unit</span> ${fmt(g.load[h.k], 3)}${hd >= 0 && g.nodes ? ` · <span class="k">holder</span> ${esc(g.nodes[hd])}` : ''}</div>`;
  const cell = lastCell;
  if (cell && cell.seq === h.seq && cellCovers(cell, h.at)) {
    s += `<hr><div class="mono"><span class="k">slice</span> [${esc(cell.lo)}, ${cell.hi === '0000000000000000' ? '2^64' : esc(cell.hi)})</div>` +
      `<div><span class="k">slices</span> ${fmt(cell.slices)} · <span class="k">load</span> ${fmt(cell.load, 3)}` +
      (cell.keys ? ` · <span class="k">keys</span> ${fmt(cell.keys, 0)}` : '') + '</div>' +
      `<div>${(cell.replicas || []).map((r) => `${esc(r.node)} <span class="k">${esc(r.role)}</span>`).join(', ') || '<span class="k">no replicas</span>'}` +
      (cell.more ? ` <span class="k">+${fmt(cell.more)} more</span>` : '') + '</div>';
  } else if (h.cellError) {
    s += `<div class="k">${esc(h.cellError)}</div>`;
  } else {
    s += '<div class="k">…</div>';
  }
  // Changes in this column over this point.
  const f = bigFrac(h.at);
  const evs = (g.events || []).filter((e) => num(e.loFrac) <= f && f < (e.hiFrac === undefined ? 1 : num(e.hiFrac)) && columnOf(g.seqs, e.seq) === h.c);
  for (const e of evs.slice(0, 4)) s += `<div><b style="color:${(MARKS[e.kind] || {}).colour}">${esc(e.kind)}</b> ${esc(e.what)} <span class="k">${esc(e.cause)}</span></div>`;
  tooltip.innerHTML = s;
  tooltip.hidden = false;
  const tw = tooltip.offsetWidth, th = tooltip.offsetHeight;
  const x = h.p.x + 14 + tw > h.p.w ? h.p.x - 14 - tw : h.p.x + 14;
  const y = h.p.y + 14 + th > h.p.h ? Math.max(0, h.p.y - 14 - th) : h.p.y + 14;
  tooltip.style.left = `${Math.max(0, x)}px`;
  tooltip.style.top = `${y}px`;
}
