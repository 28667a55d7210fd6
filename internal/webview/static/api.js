// The assigner's /ui/api, and how often the page asks it: a live stream may announce many
// changes a second, and the page must neither flood the server nor fall behind.
import { $ } from './dom.js';

// A failure shows in the banner until the same loader next succeeds.
const errors = new Map();
export function setError(key, msg) {
  if (msg) errors.set(key, msg); else errors.delete(key);
  const b = $('banner');
  b.hidden = errors.size === 0;
  b.textContent = [...errors.entries()].map(([k, m]) => `${k}: ${m}`).join(' · ');
}

// The target the page shows: ?target= of its address, the default target without it. Every
// call to the API names it, as the assigner serves one view per target.
export const target = new URLSearchParams(location.search).get('target') || '';

// api returns the address of an API path for the page's target.
export function api(path) {
  if (!target) return path;
  return path + (path.includes('?') ? '&' : '?') + 'target=' + encodeURIComponent(target);
}

export async function getJSON(url) {
  let res;
  try {
    res = await fetch(api(url), { cache: 'no-store', headers: { Accept: 'application/json' } });
  } catch (e) {
    throw new Error('cannot reach the assigner; retrying');
  }
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) throw new Error((body && body.error) || `HTTP ${res.status} ${res.statusText}`);
  if (body === null) throw new Error('the answer is not JSON');
  return body;
}

// getGrid fetches a heatmap grid in its binary form (see writeBinary in grid.go): the JSON
// of its columns and events, then its layers as typed arrays, which need no parsing.
export async function getGrid(url) {
  let res;
  try {
    res = await fetch(api(url), { cache: 'no-store' });
  } catch (e) {
    throw new Error('cannot reach the assigner; retrying');
  }
  if (!res.ok) {
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    throw new Error((body && body.error) || `HTTP ${res.status} ${res.statusText}`);
  }
  const buf = await res.arrayBuffer();
  const n = new DataView(buf).getUint32(0, true);
  const g = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, n)));
  const cells = g.w * g.h;
  let off = (4 + n + 3) & ~3;
  g.load = new Float32Array(buf, off, cells); off += 4 * cells;
  g.holder = new Int32Array(buf, off, cells); off += 4 * cells;
  g.role = new Uint8Array(buf, off, cells);
  return g;
}

// coalesced runs fn with at most one run in flight and runs at least minGap ms apart;
// kicks that arrive meanwhile fold into one more run. Failures retry with a backoff.
export function coalesced(name, fn, minGap) {
  let busy = false, again = false, urgent = false, last = -Infinity, timer = 0, backoff = 0;
  let waiters = [];
  async function run() {
    timer = 0; busy = true; again = false; urgent = false;
    const mine = waiters; waiters = [];
    last = performance.now();
    let err = null;
    try { await fn(); } catch (e) { err = e; }
    busy = false;
    if (err) {
      setError(name, err.message || String(err));
      mine.forEach((w) => w.reject(err));
      backoff = Math.min(backoff ? backoff * 2 : 2000, 15000);
      if (!again && !timer) timer = setTimeout(run, backoff);
    } else {
      setError(name, '');
      backoff = 0;
      mine.forEach((w) => w.resolve());
    }
    if (again) schedule(urgent || waiters.length > 0);
  }
  function schedule(now) {
    if (busy) { again = true; urgent = urgent || now; return; }
    const gap = typeof minGap === 'function' ? minGap() : minGap;
    const wait = now ? 0 : Math.max(0, gap - (performance.now() - last));
    if (timer) {
      if (!now) return;
      clearTimeout(timer);
    }
    timer = wait === 0 ? (run(), 0) : setTimeout(run, wait);
  }
  return {
    kick: (now) => schedule(!!now),
    wait: () => new Promise((resolve, reject) => { waiters.push({ resolve, reject }); schedule(true); }),
  };
}
