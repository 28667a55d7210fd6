// The heatmap's colours, shared by the raster, the legend and the tooltip so that they
// agree. Cell colours are precomputed ImageData words: the raster writes a million a frame.

// Sequential scale for load, light to dark, so cold is near the page colour.
const LOAD_STOPS = ['#fff7d6', '#ffe391', '#fec44f', '#fe9929', '#ec7014', '#cc4c02', '#993404', '#5c1a03', '#2d0b02'];
const rgba = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; // little-endian ImageData word
function hexRGB(h) { const n = parseInt(h.slice(1), 16); return [(n >> 16) & 255, (n >> 8) & 255, n & 255]; }
export const LOAD_LUT = new Uint32Array(256);
for (let i = 0; i < 256; i++) {
  const t = (i / 255) * (LOAD_STOPS.length - 1);
  const j = Math.min(Math.floor(t), LOAD_STOPS.length - 2);
  const a = hexRGB(LOAD_STOPS[j]), b = hexRGB(LOAD_STOPS[j + 1]), f = t - j;
  const c = a.map((x, k) => Math.round(x + (b[k] - x) * f));
  LOAD_LUT[i] = rgba(c[0], c[1], c[2]);
}
export const BLANK = rgba(251, 251, 252);
export const ROLE_PRIMARY = rgba(36, 87, 179), ROLE_SECONDARY = rgba(166, 193, 236);
export const ROLE_HAS = rgba(64, 150, 96), ROLE_NONE = rgba(240, 170, 60);
export const LOG_DECADES = 3; // the log scale shows loads from maxLoad/1000 up

// A node keeps its colour wherever it appears: the hue comes from a hash of its name.
const nodeColours = new Map();
export function nodeColour(name) {
  let c = nodeColours.get(name);
  if (c) return c;
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  // FNV alone leaves n1, n2, ... a near-constant hue step apart: mix the bits (murmur3's finalizer).
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b); h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35); h ^= h >>> 16; h >>>= 0;
  const hue = h % 360, sat = 0.5 + ((h >>> 9) % 3) * 0.15, lig = 0.42 + ((h >>> 12) % 3) * 0.1;
  const k = (n) => (n + hue / 30) % 12;
  const a = sat * Math.min(lig, 1 - lig);
  const f = (n) => Math.round(255 * (lig - a * Math.max(-1, Math.min(k(n) - 3, 9 - k(n), 1))));
  c = { rgb: [f(0), f(8), f(4)] };
  c.word = rgba(c.rgb[0], c.rgb[1], c.rgb[2]);
  c.css = `rgb(${c.rgb.join(',')})`;
  nodeColours.set(name, c);
  return c;
}

// The change marks over the heatmap; style.css draws the same colours in their legend.
export const MARKS = {
  move: { colour: '#1b2a6b', width: 1 },
  drain: { colour: '#d11a2a', width: 2 },
  primary: { colour: '#e98a00', width: 1.5 },
  split: { colour: '#0c7a43', width: 2 },
  merge: { colour: '#7b2cbf', width: 1.5 },
};
