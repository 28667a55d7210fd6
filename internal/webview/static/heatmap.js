// The heatmap's grid: which one to ask for, when, and drawing a frame of it. The grid is
// fetched for the canvas's size and the view, so a resize or a zoom asks the server again.
import { $, box, heatCanvas, hctx, overlay, octx } from './dom.js';
import { coalesced, getGrid } from './api.js';
import { TWO64, bigToHex } from './points.js';
import { sp, view, ui, seen, FORCE_W, FORCE_H, debugOut } from './state.js';
import { rasterize, drawOverlay } from './raster.js';
import { drawAxes, drawLegend, showViewInfo } from './legend.js';

export function gridSize() {
  const r = box.getBoundingClientRect();
  return {
    w: FORCE_W || Math.max(16, Math.min(2000, Math.floor(r.width))),
    h: FORCE_H || Math.max(16, Math.min(400, Math.floor(r.height))),
  };
}
function heatQuery() {
  const { w, h } = gridSize();
  const q = new URLSearchParams({ w, h, by: ui.mode });
  if (ui.mode === 'role' && ui.node) q.set('node', ui.node);
  if (view.follow) {
    if (view.span && seen.lastSeq) q.set('from', Math.max(seen.firstSeq, seen.lastSeq - view.span));
  } else {
    q.set('from', view.from);
    q.set('to', view.to);
  }
  if (view.lo !== 0n || view.hi !== TWO64) {
    q.set('lo', bigToHex(view.lo));
    q.set('hi', bigToHex(view.hi));
  }
  return q.toString();
}
// Only the parts that change what is drawn; a live step changes from but not this.
const viewKey = () => [ui.mode, ui.node, view.follow, view.span, view.from, view.to, view.lo, view.hi].join('|');

export const heatLoader = coalesced('heatmap', async () => {
  if (seen.standby || !seen.haveState) return;
  const key = viewKey();
  const t0 = performance.now();
  const g = await getGrid('api/heatmap?format=bin&' + heatQuery());
  sp.lastFetchMs = performance.now() - t0;
  if (seen.standby) return; // leadership moved while this was in flight
  if (!g || !Array.isArray(g.seqs) || !(g.w >= 0) || !(g.h >= 0)) throw new Error('malformed answer');
  if (key !== viewKey()) { heatLoader.kick(true); return; } // the view changed meanwhile
  sp.lastGrid = g;
  heatMessage(g.w && g.h && g.seqs.length ? '' : 'No history recorded yet.');
  if (g.to > seen.lastSeq) seen.lastSeq = g.to;
  draw();
}, () => Math.max(500, 2 * (sp.lastFetchMs || 0))); // a big grid on a slow link must not hog it
sp.redraw = () => heatLoader.wait();

export function heatMessage(msg) {
  const m = $('heat-msg');
  m.textContent = msg;
  m.hidden = !msg;
}

export function draw() {
  const g = sp.lastGrid;
  if (!g) return;
  const t0 = performance.now();
  if (!(g.w > 0 && g.h > 0 && g.seqs.length)) {
    hctx.clearRect(0, 0, heatCanvas.width, heatCanvas.height);
    octx.clearRect(0, 0, overlay.width, overlay.height);
    seen.nonzero = 0;
  } else {
    rasterize(g);
    drawOverlay(g);
  }
  sp.lastFrameMs = performance.now() - t0;
  sp.frames++;
  heatCanvas.dataset.columns = String(g.w);
  heatCanvas.dataset.nonzero = String(seen.nonzero);
  drawAxes(g);
  drawLegend(g);
  showViewInfo(g);
  debugOut();
}

// A map from before leadership moved would only mislead: a standby shows none.
export function clearHeatmap() {
  sp.lastGrid = null;
  hctx.clearRect(0, 0, heatCanvas.width, heatCanvas.height);
  octx.clearRect(0, 0, overlay.width, overlay.height);
  heatCanvas.dataset.columns = '0';
  heatCanvas.dataset.nonzero = '0';
}
