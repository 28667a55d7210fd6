// The pixels of a frame: the grid's cells onto the heat canvas, one pixel a cell, and the
// change marks onto the overlay at the screen's resolution. This is the hot path of a frame.
import { box, heatCanvas, hctx, overlay, octx } from './dom.js';
import { num } from './format.js';
import { hexToBig, hiToBig, bigFrac } from './points.js';
import { ui, seen } from './state.js';
import { LOAD_LUT, BLANK, ROLE_PRIMARY, ROLE_SECONDARY, ROLE_HAS, ROLE_NONE, LOG_DECADES, MARKS, nodeColour } from './colours.js';

let image = null; // kept across frames: a new ImageData of a million cells a frame is garbage

export function rasterize(g) {
  const W = g.w, H = g.h, N = W * H;
  if (heatCanvas.width !== W || heatCanvas.height !== H) { heatCanvas.width = W; heatCanvas.height = H; }
  if (!image || image.width !== W || image.height !== H) image = hctx.createImageData(W, H);
  const px = new Uint32Array(image.data.buffer);
  const holder = g.holder && g.holder.length === N ? g.holder : null;
  const load = g.load && g.load.length === N ? g.load : null;
  const role = g.role && g.role.length === N ? g.role : null;
  const names = g.nodes || [];
  const nodeLut = new Uint32Array(names.length);
  names.forEach((n, i) => { nodeLut[i] = nodeColour(n).word; });
  const max = num(g.maxLoad) > 0 ? num(g.maxLoad) : 1;
  const mode = ui.mode, useLog = ui.scale === 'log', byNode = !!ui.node;
  const logK = 255 / (LOG_DECADES * Math.LN10), logMax = Math.log(max);
  let nz = 0;
  if (holder) for (let k = 0; k < N; k++) if (holder[k] >= 0) nz++;
  // One plain loop per mode, each cell a lookup: a shared loop with a callback per mode
  // goes megamorphic and runs several times slower over a million cells.
  const zero = LOAD_LUT[0];
  for (let c = 0; c < W; c++) {
    let k = c * H, p = c;
    const end = k + H;
    if (mode === 'load') {
      for (; k < end; k++, p += W) {
        const v = load ? load[k] : 0;
        if (v > 0) {
          const i = useLog ? 255 + (Math.log(v) - logMax) * logK : 255 * Math.sqrt(v / max);
          px[p] = LOAD_LUT[i < 1 ? 1 : i > 255 ? 255 : i | 0];
        } else px[p] = holder && holder[k] >= 0 ? zero : BLANK;
      }
    } else if (mode === 'node') {
      for (; k < end; k++, p += W) {
        const hd = holder ? holder[k] : -1;
        px[p] = hd >= 0 && hd < nodeLut.length ? nodeLut[hd] : BLANK;
      }
    } else if (byNode) {
      for (; k < end; k++, p += W) {
        const ro = role ? role[k] : 0;
        px[p] = ro === 1 ? ROLE_PRIMARY : ro === 2 ? ROLE_SECONDARY : BLANK;
      }
    } else {
      for (; k < end; k++, p += W) px[p] = role && role[k] === 1 ? ROLE_HAS : holder && holder[k] >= 0 ? ROLE_NONE : BLANK;
    }
  }
  seen.nonzero = nz;
  hctx.putImageData(image, 0, 0);
}

// The first output column showing seq or a later one: where a change becomes visible.
export function columnOf(seqs, seq) {
  let a = 0, b = seqs.length;
  while (a < b) { const m = (a + b) >> 1; if (seqs[m] < seq) a = m + 1; else b = m; }
  return a < seqs.length ? a : -1;
}

export function drawOverlay(g) {
  const dpr = window.devicePixelRatio || 1;
  const cw = box.clientWidth, ch = box.clientHeight;
  const ow = Math.max(1, Math.round(cw * dpr)), oh = Math.max(1, Math.round(ch * dpr));
  if (overlay.width !== ow || overlay.height !== oh) { overlay.width = ow; overlay.height = oh; }
  octx.clearRect(0, 0, ow, oh);
  const evs = g.events || [];
  if (!ui.events || !evs.length || !g.seqs.length) return;
  // Positions from the hex points in BigInt: deep in a zoom, float fractions of the whole
  // space no longer tell neighbouring rows apart.
  const gLo = hexToBig(g.lo), gSpan = hiToBig(g.hi) - gLo, SC = 1n << 24n;
  const fLo = bigFrac(gLo), fSpan = bigFrac(gSpan);
  const fy = (hex, frac, isHi) => (typeof hex === 'string'
    ? (Number(((isHi ? hiToBig(hex) : hexToBig(hex)) - gLo) * SC / gSpan) / Number(SC)) * oh
    : ((num(frac) - fLo) / fSpan) * oh);
  const colW = ow / g.w;
  const byKind = { move: [], drain: [], primary: [], split: [], merge: [] };
  for (const e of evs) {
    const c = columnOf(g.seqs, e.seq);
    if (c < 0 || !byKind[e.kind]) continue;
    const y0 = Math.max(0, fy(e.lo, e.loFrac, false)), y1 = Math.min(oh, fy(e.hi, e.hiFrac === undefined ? 1 : e.hiFrac, true));
    if (y1 < 0 || y0 > oh) continue;
    byKind[e.kind].push((c + 0.5) * colW, y0, y1);
  }
  const t = 3 * dpr; // half the size of the small marks
  for (const kind of Object.keys(byKind)) {
    const a = byKind[kind];
    if (!a.length) continue;
    octx.beginPath();
    for (let i = 0; i < a.length; i += 3) {
      const x = Math.round(a[i]) + 0.5, y0 = a[i + 1], y1 = a[i + 2], ym = (y0 + y1) / 2;
      if (kind === 'split') {
        octx.moveTo(x - t - 1, ym); octx.lineTo(x + t + 1, ym);
      } else if (kind === 'merge') {
        octx.moveTo(x, ym - t); octx.lineTo(x + t, ym); octx.lineTo(x, ym + t); octx.lineTo(x - t, ym); octx.closePath();
      } else {
        // short ranges still get a visible line
        const pad2 = Math.max(0, (2 * dpr - (y1 - y0)) / 2);
        octx.moveTo(x, y0 - pad2); octx.lineTo(x, y1 + pad2);
      }
    }
    octx.strokeStyle = MARKS[kind].colour;
    octx.lineWidth = MARKS[kind].width * dpr;
    octx.stroke();
  }
}
