// The elements that several modules draw on or listen to, looked up once. Modules run
// deferred, after the document is parsed, so every element is there by now.
export const $ = (id) => document.getElementById(id);

export const heatCanvas = $('heatmap');
export const hctx = heatCanvas.getContext('2d');
export const overlay = $('overlay');
export const octx = overlay.getContext('2d');
export const box = $('heat-box');
export const tooltip = $('tooltip');

// Where a mouse event falls in the heat box, clamped to it: a drag may end outside.
export function boxPoint(ev) {
  const r = box.getBoundingClientRect();
  return { x: Math.min(Math.max(ev.clientX - r.left, 0), r.width), y: Math.min(Math.max(ev.clientY - r.top, 0), r.height), w: r.width, h: r.height };
}
