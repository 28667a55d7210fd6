// What frames the heatmap, redrawn with each frame: the axes, the legend of the colouring,
// and what part of the history and of the space the view is zoomed to.
import { $ } from './dom.js';
import { esc, fmt, fmtTime, num } from './format.js';
import { TWO64, hexToBig, hiToBig, bigToHex, pointAt } from './points.js';
import { view, ui } from './state.js';
import { LOAD_LUT, LOG_DECADES, nodeColour } from './colours.js';

export function drawAxes(g) {
  const lo = hexToBig(g.lo), hi = hiToBig(g.hi);
  let y = '';
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const p = f === 1 ? hi - 1n : pointAt(lo, hi, f);
    y += `<span style="top:${f * 100}%">${bigToHex(p)}</span>`;
  }
  $('yaxis').innerHTML = y;
  let x = '';
  const n = g.times ? g.times.length : 0;
  if (n) {
    const ticks = Math.min(6, n);
    for (let i = 0; i < ticks; i++) {
      const c = ticks === 1 ? 0 : Math.round((i * (n - 1)) / (ticks - 1));
      const cls = i === 0 ? 'first' : i === ticks - 1 ? 'last' : '';
      x += `<span class="${cls}" style="left:${((c + 0.5) / n) * 100}%">${fmtTime(g.times[c])} #${g.seqs[c]}</span>`;
    }
  }
  $('xaxis').innerHTML = x;
}

let legendKey = '';
export function drawLegend(g) {
  const names = g.nodes || [];
  const key = [ui.mode, ui.scale, ui.node, g.maxLoad, names.length, names[0], names[names.length - 1]].join('|');
  if (key === legendKey) return;
  legendKey = key;
  const el = $('legend');
  const sw = (css, label) => `<span><span class="swatch" style="background:${css}"></span>${esc(label)}</span>`;
  if (ui.mode === 'load') {
    const max = num(g.maxLoad);
    const lowest = ui.scale === 'log' ? max / 10 ** LOG_DECADES : 0;
    el.innerHTML = `<span>load per unit of key space (${ui.scale})</span><span>${fmt(lowest, 3)}</span>` +
      `<canvas id="legend-ramp" width="256" height="1"></canvas><span>${fmt(max, 2)}</span>` +
      sw('rgb(251,251,252)', 'nothing recorded');
    const lc = $('legend-ramp').getContext('2d');
    const im = lc.createImageData(256, 1);
    new Uint32Array(im.data.buffer).set(LOAD_LUT);
    lc.putImageData(im, 0, 0);
  } else if (ui.mode === 'node') {
    const shown = names.slice(0, 16);
    el.innerHTML = shown.map((n) => sw(nodeColour(n).css, n)).join('') +
      (names.length > shown.length ? `<span>+${names.length - shown.length} more (hover for names)</span>` : '');
  } else if (ui.node) {
    el.innerHTML = sw('rgb(36,87,179)', `${ui.node} primary`) + sw('rgb(166,193,236)', `${ui.node} secondary / replica`) +
      sw('rgb(251,251,252)', 'not held by it');
  } else {
    el.innerHTML = sw('rgb(64,150,96)', 'has a primary') + sw('rgb(240,170,60)', 'held, no primary') + sw('rgb(251,251,252)', 'not held');
  }
}

export function showViewInfo(g) {
  const zoomedKeys = view.lo !== 0n || view.hi !== TWO64;
  const zoomedTime = !view.follow || view.span > 0;
  $('reset-zoom').disabled = !zoomedKeys && !zoomedTime;
  $('zoom-info').textContent = zoomedKeys || zoomedTime
    ? `keys [${g.lo}, ${g.hi === '0000000000000000' ? '2^64' : g.hi}) · seqs ${g.from}–${g.to}` : '';
  $('follow-info').textContent = view.follow ? 'following live' : 'paused in the past';
}
