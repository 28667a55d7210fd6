// Text for the page. Everything here returns a string meant for innerHTML, so whatever came
// from the server goes through esc.

export function clampInt(s, lo, hi) {
  const n = parseInt(s, 10);
  return Number.isFinite(n) ? Math.min(Math.max(n, lo), hi) : 0;
}
export function esc(s) {
  return String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}
// protojson writes 64-bit integers as strings and non-finite doubles as "NaN"/"Infinity".
export function num(v) {
  if (typeof v === 'number') return v;
  if (typeof v === 'string' && v !== '') { const n = Number(v); return Number.isNaN(n) ? NaN : n; }
  return 0;
}
export function fmt(v, digits = 2) {
  if (v === undefined || v === null || v === '') return '0';
  const n = num(v);
  if (!Number.isFinite(n)) return esc(String(v));
  return Number.isInteger(n) ? String(n) : n.toFixed(digits);
}
const pad = (n, w = 2) => String(n).padStart(w, '0');
export function fmtTime(ms) {
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? '' : `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
export function fmtDateTime(ms) {
  const d = new Date(ms);
  if (Number.isNaN(d.getTime())) return '';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${fmtTime(ms)}.${pad(d.getMilliseconds(), 3)}`;
}
export function ago(iso) {
  const t = Date.parse(iso);
  if (!iso || Number.isNaN(t)) return '';
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) return `${s.toFixed(0)}s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)}m ago`;
  return `${(s / 3600).toFixed(1)}h ago`;
}
