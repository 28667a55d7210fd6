// What the modules share. An imported binding cannot be assigned by the importer, so what
// changes lives in objects that every module holds the same reference to.
import { $ } from './dom.js';
import { clampInt } from './format.js';
import { TWO64 } from './points.js';

const qs = new URLSearchParams(location.search);
export const DEBUG = qs.has('debug');
// ?w=&h= pin the grid size, so benchmarks get the same grid whatever the window is.
export const FORCE_W = clampInt(qs.get('w'), 0, 2000);
export const FORCE_H = clampInt(qs.get('h'), 0, 1000);

// window.sliceplane is what the browser tests and the benchmark read of the page. redraw is
// filled in by heatmap.js, which owns the loader it waits for.
export const sp = {
  frames: 0,
  lastFrameMs: 0,
  lastGrid: null,
  feedCount: 0,
  redraw: null,
};
window.sliceplane = sp;

// What the heatmap shows. follow: the window ends at the live edge and moves with it;
// span: how many history seqs a following window covers (0: the whole history).
export const view = { follow: true, span: 0, from: 0, to: 0, lo: 0n, hi: TWO64 };
export const ui = { mode: 'load', scale: 'log', node: '', events: true };
export const seen = {
  lastSeq: 0,       // newest history seq we have heard of
  firstSeq: 1,
  standby: false,
  haveState: false, // the heatmap waits for the first state, which says if this is the leader
  nonzero: 0,       // cells of the last frame that some node holds
};

export function debugOut() {
  if (!DEBUG) return;
  const d = $('debug');
  d.hidden = false;
  const g = sp.lastGrid;
  d.textContent = JSON.stringify({
    frames: sp.frames, lastFrameMs: Math.round(sp.lastFrameMs * 100) / 100, feedCount: sp.feedCount,
    lastFetchMs: Math.round(sp.lastFetchMs || 0), lastStateMs: Math.round(sp.lastStateMs || 0),
    w: g && g.w, h: g && g.h, nonzero: seen.nonzero, events: g && g.events ? g.events.length : 0,
  });
}
