// The mouse on the heatmap: a drag selects a window of history and of the space to zoom
// to, a double click or the button goes back. Hover is wired here too, because a drag in
// progress takes the mouse from the tooltip.
import { $, boxPoint, overlay } from './dom.js';
import { TWO64, hexToBig, hiToBig, pointAt } from './points.js';
import { sp, view } from './state.js';
import { heatLoader } from './heatmap.js';
import { hoverAt, hideTooltip } from './tooltip.js';

let drag = null;
overlay.addEventListener('mousedown', (ev) => {
  if (ev.button !== 0 || !sp.lastGrid) return;
  ev.preventDefault();
  drag = boxPoint(ev);
  hideTooltip();
});
// On the window, not the overlay: a drag may leave the heatmap before the button is let go.
window.addEventListener('mousemove', (ev) => {
  if (!drag) return;
  const p = boxPoint(ev), s = $('selection');
  s.hidden = false;
  Object.assign(s.style, {
    left: `${Math.min(drag.x, p.x)}px`, top: `${Math.min(drag.y, p.y)}px`,
    width: `${Math.abs(p.x - drag.x)}px`, height: `${Math.abs(p.y - drag.y)}px`,
  });
});
window.addEventListener('mouseup', (ev) => {
  if (!drag) return;
  const a = drag, b = boxPoint(ev);
  drag = null;
  $('selection').hidden = true;
  zoomTo(a, b);
});
function zoomTo(a, b) {
  const g = sp.lastGrid;
  const dx = Math.abs(b.x - a.x), dy = Math.abs(b.y - a.y);
  if (!g || !g.seqs.length || (dx < 4 && dy < 4)) return; // a click, not a drag
  if (dx >= 4) {
    const W = g.seqs.length;
    const c0 = Math.max(0, Math.floor((Math.min(a.x, b.x) / a.w) * W));
    const c1 = Math.min(W - 1, Math.floor((Math.max(a.x, b.x) / a.w) * W));
    const from = g.seqs[c0], to = g.seqs[c1];
    // A window that ends at the live edge keeps following it.
    if (c1 === W - 1 && view.follow) {
      view.span = Math.max(1, to - from);
    } else {
      view.follow = false;
      view.from = from;
      view.to = Math.max(from, to);
    }
  }
  if (dy >= 4) {
    const lo = hexToBig(g.lo), hi = hiToBig(g.hi);
    const y0 = Math.min(a.y, b.y) / a.h, y1 = Math.max(a.y, b.y) / a.h;
    const nlo = pointAt(lo, hi, y0);
    let nhi = y1 >= 1 ? hi : pointAt(lo, hi, y1);
    if (nhi <= nlo) nhi = nlo + 1n;
    view.lo = nlo;
    view.hi = nhi;
  }
  heatLoader.kick(true);
}
function resetZoom() {
  Object.assign(view, { follow: true, span: 0, from: 0, to: 0, lo: 0n, hi: TWO64 });
  heatLoader.kick(true);
}
$('reset-zoom').addEventListener('click', resetZoom);
overlay.addEventListener('dblclick', resetZoom);

overlay.addEventListener('mousemove', (ev) => { if (!drag) hoverAt(ev); });
overlay.addEventListener('mouseleave', hideTooltip);
