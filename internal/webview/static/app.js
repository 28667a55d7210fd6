// Sliceplane web view: the browser side of the contract in the assigner's /ui/ API.
// Plain script, no build step, no dependencies.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const TWO64 = 1n << 64n;
  const FRAC_BITS = 32n; // fractions become BigInts with this many bits before scaling a range
  const qs = new URLSearchParams(location.search);
  const DEBUG = qs.has('debug');
  // ?w=&h= pin the grid size, so benchmarks get the same grid whatever the window is.
  const FORCE_W = clampInt(qs.get('w'), 0, 2000);
  const FORCE_H = clampInt(qs.get('h'), 0, 1000);

  const heatCanvas = $('heatmap');
  const hctx = heatCanvas.getContext('2d');
  const overlay = $('overlay');
  const octx = overlay.getContext('2d');
  const box = $('heat-box');
  const tooltip = $('tooltip');

  const sp = {
    frames: 0,
    lastFrameMs: 0,
    lastGrid: null,
    feedCount: 0,
    redraw: () => heatLoader.wait(),
  };
  window.sliceplane = sp;

  // What the heatmap shows. follow: the window ends at the live edge and moves with it;
  // span: how many history seqs a following window covers (0: the whole history).
  const view = { follow: true, span: 0, from: 0, to: 0, lo: 0n, hi: TWO64 };
  const ui = { mode: 'load', scale: 'log', node: '', events: true };
  let lastSeq = 0;      // newest history seq we have heard of
  let firstSeq = 1;
  let standby = false;
  let haveState = false; // the heatmap waits for the first state, which says if this is the leader
  let nonzero = 0;
  let image = null;

  // ---------- small helpers ----------
  function clampInt(s, lo, hi) {
    const n = parseInt(s, 10);
    return Number.isFinite(n) ? Math.min(Math.max(n, lo), hi) : 0;
  }
  function esc(s) {
    return String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  }
  // protojson writes 64-bit integers as strings and non-finite doubles as "NaN"/"Infinity".
  function num(v) {
    if (typeof v === 'number') return v;
    if (typeof v === 'string' && v !== '') { const n = Number(v); return Number.isNaN(n) ? NaN : n; }
    return 0;
  }
  function fmt(v, digits = 2) {
    if (v === undefined || v === null || v === '') return '0';
    const n = num(v);
    if (!Number.isFinite(n)) return esc(String(v));
    return Number.isInteger(n) ? String(n) : n.toFixed(digits);
  }
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  function fmtTime(ms) {
    const d = new Date(ms);
    return Number.isNaN(d.getTime()) ? '' : `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function fmtDateTime(ms) {
    const d = new Date(ms);
    if (Number.isNaN(d.getTime())) return '';
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${fmtTime(ms)}.${pad(d.getMilliseconds(), 3)}`;
  }
  function ago(iso) {
    const t = Date.parse(iso);
    if (!iso || Number.isNaN(t)) return '';
    const s = Math.max(0, (Date.now() - t) / 1000);
    if (s < 60) return `${s.toFixed(0)}s ago`;
    if (s < 3600) return `${(s / 60).toFixed(0)}m ago`;
    return `${(s / 3600).toFixed(1)}h ago`;
  }

  // Hash points: 16 hex digits; "0000000000000000" as an upper bound means 2^64.
  // A malformed point reads as 0 rather than throwing in the middle of a draw.
  const hexToBig = (h) => (/^[0-9a-fA-F]{1,16}$/.test(h) ? BigInt('0x' + h) : 0n);
  const hiToBig = (h) => { const v = hexToBig(h); return v === 0n ? TWO64 : v; };
  const bigToHex = (v) => (v >= TWO64 ? 0n : v).toString(16).padStart(16, '0');
  const bigFrac = (v) => Number(v) / 2 ** 64;
  // The point at fraction f of [lo, hi), computed in BigInt so no hex digit is lost.
  function pointAt(lo, hi, f) {
    const q = BigInt(Math.floor(Math.min(Math.max(f, 0), 1) * 2 ** 32));
    return lo + ((hi - lo) * q) / (1n << FRAC_BITS);
  }
  // A protojson Range: decimal strings, zero fields omitted.
  function rangeText(r) {
    if (!r) return '';
    const big = (v) => { try { return BigInt(v || 0); } catch (err) { return 0n; } };
    const s = big(r.start);
    const e = r.endOfSpace ? TWO64 : big(r.end);
    return `[${bigToHex(s)}, ${e >= TWO64 ? '2^64' : bigToHex(e)})`;
  }

  // ---------- errors banner ----------
  const errors = new Map();
  function setError(key, msg) {
    if (msg) errors.set(key, msg); else errors.delete(key);
    const b = $('banner');
    b.hidden = errors.size === 0;
    b.textContent = [...errors.entries()].map(([k, m]) => `${k}: ${m}`).join(' · ');
  }

  async function getJSON(url) {
    let res;
    try {
      res = await fetch(url, { cache: 'no-store', headers: { Accept: 'application/json' } });
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
  async function getGrid(url) {
    let res;
    try {
      res = await fetch(url, { cache: 'no-store' });
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
  function coalesced(name, fn, minGap) {
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

  // ---------- colours ----------
  // Sequential scale for load, light to dark, so cold is near the page colour.
  const LOAD_STOPS = ['#fff7d6', '#ffe391', '#fec44f', '#fe9929', '#ec7014', '#cc4c02', '#993404', '#5c1a03', '#2d0b02'];
  const rgba = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; // little-endian ImageData word
  function hexRGB(h) { const n = parseInt(h.slice(1), 16); return [(n >> 16) & 255, (n >> 8) & 255, n & 255]; }
  const LOAD_LUT = new Uint32Array(256);
  const LOAD_RGB = [];
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * (LOAD_STOPS.length - 1);
    const j = Math.min(Math.floor(t), LOAD_STOPS.length - 2);
    const a = hexRGB(LOAD_STOPS[j]), b = hexRGB(LOAD_STOPS[j + 1]), f = t - j;
    const c = a.map((x, k) => Math.round(x + (b[k] - x) * f));
    LOAD_RGB.push(c);
    LOAD_LUT[i] = rgba(c[0], c[1], c[2]);
  }
  const BLANK = rgba(251, 251, 252);
  const ROLE_PRIMARY = rgba(36, 87, 179), ROLE_SECONDARY = rgba(166, 193, 236);
  const ROLE_HAS = rgba(64, 150, 96), ROLE_NONE = rgba(240, 170, 60);
  const LOG_DECADES = 3; // the log scale shows loads from maxLoad/1000 up

  // A node keeps its colour wherever it appears: the hue comes from a hash of its name.
  const nodeColours = new Map();
  function nodeColour(name) {
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

  // ---------- heatmap ----------
  function gridSize() {
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
      if (view.span && lastSeq) q.set('from', Math.max(firstSeq, lastSeq - view.span));
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

  const heatLoader = coalesced('heatmap', async () => {
    if (standby || !haveState) return;
    const key = viewKey();
    const t0 = performance.now();
    const g = await getGrid('api/heatmap?format=bin&' + heatQuery());
    sp.lastFetchMs = performance.now() - t0;
    if (standby) return; // leadership moved while this was in flight
    if (!g || !Array.isArray(g.seqs) || !(g.w >= 0) || !(g.h >= 0)) throw new Error('malformed answer');
    if (key !== viewKey()) { heatLoader.kick(true); return; } // the view changed meanwhile
    sp.lastGrid = g;
    heatMessage(g.w && g.h && g.seqs.length ? '' : 'No history recorded yet.');
    if (g.to > lastSeq) lastSeq = g.to;
    draw();
  }, () => Math.max(500, 2 * (sp.lastFetchMs || 0))); // a big grid on a slow link must not hog it

  function heatMessage(msg) {
    const m = $('heat-msg');
    m.textContent = msg;
    m.hidden = !msg;
  }

  function draw() {
    const g = sp.lastGrid;
    if (!g) return;
    const t0 = performance.now();
    if (!(g.w > 0 && g.h > 0 && g.seqs.length)) {
      hctx.clearRect(0, 0, heatCanvas.width, heatCanvas.height);
      octx.clearRect(0, 0, overlay.width, overlay.height);
      nonzero = 0;
    } else {
      rasterize(g);
      drawOverlay(g);
    }
    sp.lastFrameMs = performance.now() - t0;
    sp.frames++;
    heatCanvas.dataset.columns = String(g.w);
    heatCanvas.dataset.nonzero = String(nonzero);
    drawAxes(g);
    drawLegend(g);
    showViewInfo(g);
    debugOut();
  }

  function rasterize(g) {
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
    nonzero = nz;
    hctx.putImageData(image, 0, 0);
  }

  // The first output column showing seq or a later one: where a change becomes visible.
  function columnOf(seqs, seq) {
    let a = 0, b = seqs.length;
    while (a < b) { const m = (a + b) >> 1; if (seqs[m] < seq) a = m + 1; else b = m; }
    return a < seqs.length ? a : -1;
  }
  const MARKS = {
    move: { colour: '#1b2a6b', width: 1 },
    drain: { colour: '#d11a2a', width: 2 },
    primary: { colour: '#e98a00', width: 1.5 },
    split: { colour: '#0c7a43', width: 2 },
    merge: { colour: '#7b2cbf', width: 1.5 },
  };

  function drawOverlay(g) {
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

  function drawAxes(g) {
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
  function drawLegend(g) {
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

  function showViewInfo(g) {
    const zoomedKeys = view.lo !== 0n || view.hi !== TWO64;
    const zoomedTime = !view.follow || view.span > 0;
    $('reset-zoom').disabled = !zoomedKeys && !zoomedTime;
    $('zoom-info').textContent = zoomedKeys || zoomedTime
      ? `keys [${g.lo}, ${g.hi === '0000000000000000' ? '2^64' : g.hi}) · seqs ${g.from}–${g.to}` : '';
    $('follow-info').textContent = view.follow ? 'following live' : 'paused in the past';
  }

  function debugOut() {
    if (!DEBUG) return;
    const d = $('debug');
    d.hidden = false;
    const g = sp.lastGrid;
    d.textContent = JSON.stringify({
      frames: sp.frames, lastFrameMs: Math.round(sp.lastFrameMs * 100) / 100, feedCount: sp.feedCount,
      lastFetchMs: Math.round(sp.lastFetchMs || 0), lastStateMs: Math.round(sp.lastStateMs || 0),
      w: g && g.w, h: g && g.h, nonzero, events: g && g.events ? g.events.length : 0,
    });
  }

  // ---------- zoom by dragging ----------
  let drag = null;
  function boxPoint(ev) {
    const r = box.getBoundingClientRect();
    return { x: Math.min(Math.max(ev.clientX - r.left, 0), r.width), y: Math.min(Math.max(ev.clientY - r.top, 0), r.height), w: r.width, h: r.height };
  }
  overlay.addEventListener('mousedown', (ev) => {
    if (ev.button !== 0 || !sp.lastGrid) return;
    ev.preventDefault();
    drag = boxPoint(ev);
    hideTooltip();
  });
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

  // ---------- hover ----------
  let hover = null;           // {seq, at (BigInt), ...} under the mouse
  let cellWant = null;        // the newest cell request not yet sent
  let cellBusy = false;
  let lastCell = null;
  overlay.addEventListener('mousemove', (ev) => {
    const g = sp.lastGrid;
    if (drag || !g || !g.seqs.length) return;
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
  });
  overlay.addEventListener('mouseleave', hideTooltip);
  function hideTooltip() { hover = null; cellWant = null; tooltip.hidden = true; }
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

  // ---------- state: header, nodes, passes, feed ----------
  const stateLoader = coalesced('state', async () => {
    applyState(await getJSON('api/state'));
  }, 500);

  function applyState(s) {
    const t0 = performance.now();
    applyState1(s);
    sp.lastStateMs = performance.now() - t0;
    debugOut();
  }
  function applyState1(s) {
    const wasStandby = standby, first = !haveState;
    standby = s.leader === false;
    haveState = true;
    const note = $('leader-note');
    if (standby) {
      if (!wasStandby) {
        // A map from before leadership moved would only mislead.
        sp.lastGrid = null;
        hctx.clearRect(0, 0, heatCanvas.width, heatCanvas.height);
        octx.clearRect(0, 0, overlay.width, overlay.height);
        heatCanvas.dataset.columns = '0';
        heatCanvas.dataset.nonzero = '0';
        heatMessage('The heatmap is served by the leader.');
        renderNodes({});
        renderPasses([]);
        renderFeed([]);
      }
      note.hidden = false;
      note.textContent = `not the leader; the leader is at ${s.leaderAddress || 'an unknown address'}` + (s.error ? ` (${s.error})` : '');
      $('status').innerHTML = '<div><dt>role</dt><dd>standby</dd></div>';
      setError('heatmap', '');
      return;
    }
    note.hidden = true;
    setError('server', s.error || '');
    const h = s.history || {};
    if (h.first) firstSeq = num(h.first);
    if (num(h.last) > lastSeq) lastSeq = num(h.last);
    renderStatus(s);
    renderNodes(s);
    // A pass comes as {time, explain}: the explanation is the Explain RPC's, as protojson.
    renderPasses((s.passes || []).map((e) => Object.assign({ time: e.time }, e.explain || {})), s.status || {});
    renderFeed(s.quanta || []);
    if (!es) connect();
    if (wasStandby || first) {
      heatMessage(sp.lastGrid ? '' : 'Loading the heatmap…');
      heatLoader.kick(true);
    }
  }

  function renderStatus(s) {
    const st = s.status || {};
    const pos = st.position || {};
    const item = (k, v, bad) => `<div><dt>${k}</dt><dd${bad ? ' class="bad"' : ''}>${v}</dd></div>`;
    let out = item('leader', esc(s.leaderAddress || 'this assigner')) +
      item('term/seq', `${fmt(pos.term)}/${fmt(pos.seq)}`) +
      item('generation', fmt(st.generation)) +
      item('slices', fmt(st.slices)) +
      item('nodes', fmt(st.nodes)) +
      item('imbalance', fmt(st.imbalance, 3)) +
      item('algorithm', esc(st.algorithm || '—')) +
      item('frozen', st.frozen ? 'yes' : 'no', st.frozen) +
      item('pass failures', fmt(st.passFailures), num(st.passFailures) > 0);
    if (num(st.handoffs)) out += item('handoffs', fmt(st.handoffs));
    if (st.passError) out += item('pass error', esc(st.passError), true);
    if (st.sourceError) out += item('source error', esc(st.sourceError) + (st.sourceMisconfigured ? ' (misconfigured)' : ''), true);
    if ((st.quarantined || []).length) out += item('quarantined', String(st.quarantined.length), true);
    const h = s.history || {};
    if (h.columns) out += item('history', `${fmt(h.columns)} of ${fmt(h.capacity)} passes · ${fmt(num(h.bytes) / 1048576, 1)} MiB`);
    $('status').innerHTML = out;
  }

  const STATES = new Set(['serving', 'loading', 'draining', 'stale', 'quarantined']);
  let nodesHTML = '', nodeIDs = '';
  function renderNodes(s) {
    const nodes = s.nodes || [];
    const states = s.nodeStates || {};
    const rows = [];
    // Loads are over capacity, in the units the nodes report: the bars compare the nodes.
    const top = Math.max(1e-9, ...nodes.map((n) => num(n.load)));
    for (const n of nodes) {
      const id = (n.node && n.node.id) || n.id || '';
      const zone = (s.zones || {})[id] || '';
      const cap = num(n.node && n.node.capacity) || 1;
      const load = num(n.load);
      const pct = Math.max(0, Math.min(100, 100 * load / top));
      let state = states[id];
      if (!STATES.has(state)) state = n.draining ? 'draining' : n.stale ? 'stale' : num(n.loading) > 0 ? 'loading' : 'serving';
      rows.push(`<tr><td>${esc(id)}</td><td>${esc(zone)}</td>` +
        `<td title="load over capacity (capacity ${fmt(cap, 2)}); the bar is against the most loaded node"><span class="bar"><i style="width:${pct.toFixed(1)}%"></i></span>${fmt(load, 2)}</td>` +
        `<td class="num">${fmt(cap, 2)}</td>` +
        `<td class="num">${fmt(n.slices)}</td><td class="num">${fmt(n.primaries)}</td><td class="num">${fmt(n.loading)}</td>` +
        `<td><span class="st st-${state}">${state}</span></td><td title="${esc(n.lastSeen)}">${esc(ago(n.lastSeen))}</td></tr>`);
    }
    const html = rows.join('');
    if (html !== nodesHTML) { $('nodes-body').innerHTML = html; nodesHTML = html; }
    $('nodes-count').textContent = `(${nodes.length})`;
    // The role-mode node selector follows the membership.
    const ids = nodes.map((n) => (n.node && n.node.id) || n.id || '').sort();
    const joined = ids.join('\n');
    if (joined !== nodeIDs) {
      nodeIDs = joined;
      const sel = $('node-select');
      const keep = ui.node;
      sel.innerHTML = '<option value="">(none: primary or not)</option>' +
        ids.map((id) => `<option value="${esc(id)}">${esc(id)}</option>`).join('');
      sel.value = ids.includes(keep) ? keep : '';
    }
  }

  let passesKey = '';
  // Only what the reader opened or closed sticks across updates; otherwise the newest is open.
  const userOpen = new Map();
  $('explain').addEventListener('click', (e) => {
    const sum = e.target.closest('summary');
    if (sum) userOpen.set(sum.parentElement.dataset.key, !sum.parentElement.open);
  });
  function renderPasses(passes, st = {}) {
    const key = JSON.stringify([passes, st.passFailures, st.passError]);
    if (key === passesKey) return;
    passesKey = key;
    const el = $('explain');
    // The passes listed are those that succeeded; a run of failures since is only counted.
    const failing = num(st.passFailures) > 0
      ? `<p class="err">${fmt(st.passFailures)} failed pass${num(st.passFailures) === 1 ? '' : 'es'} in a row` +
        `${st.passError ? `: ${esc(st.passError)}` : ''}${st.passErrorTime ? ` (${esc(ago(st.passErrorTime))})` : ''}</p>` : '';
    if (!passes.length) { el.innerHTML = failing + '<p class="k">no pass yet</p>'; return; }
    el.innerHTML = failing + passes.map((p, i) => {
      const pos = p.position || {};
      const k = `${fmt(pos.term)}.${fmt(pos.seq)}`;
      const open = userOpen.has(k) ? userOpen.get(k) : i === 0;
      const cands = p.candidates || [];
      const rows = cands.slice(0, 200).map((c) => `<tr class="${c.chosen ? 'chosen' : 'refused'}"><td>${c.chosen ? '✓' : '✗'}</td>` +
        `<td>${esc(c.action)}</td><td class="mono">${rangeText(c.slice)}</td><td>${esc(c.from)} → ${esc((c.to || []).join(', '))}</td>` +
        `<td class="num">${fmt(c.gain, 3)}</td><td class="num">${fmt(c.cost, 3)}</td><td>${c.chosen ? 'chosen' : esc(c.reason || 'refused')}</td></tr>`).join('');
      return `<details data-key="${esc(k)}"${open ? ' open' : ''}><summary>` +
        `<b>#${esc(k)}</b> ${esc(p.time ? fmtTime(Date.parse(p.time)) : '')} · ${esc(p.algorithm || '')} · ` +
        `imbalance ${fmt(p.imbalanceBefore, 3)}→${fmt(p.imbalanceAfter, 3)} · churn ${fmt(p.churnMove, 3)}/${fmt(p.churnBudget, 3)} · ` +
        `${fmt(p.moves)} moves, ${fmt(p.splits)} splits, ${fmt(p.merges)} merges` +
        (p.stop ? ` · stop: ${esc(p.stop)}` : '') +
        (p.passError ? ` <span class="err">· failed ${fmt(p.passFailures)}×: ${esc(p.passError)}</span>` : '') +
        '</summary>' +
        (cands.length ? `<table><thead><tr><th></th><th>action</th><th>slice</th><th>from → to</th><th>gain</th><th>cost</th><th>outcome</th></tr></thead><tbody>${rows}</tbody></table>` +
          (cands.length > 200 ? `<p class="k">+${cands.length - 200} more candidates</p>` : '') : '<p class="k">no candidates</p>') +
        '</details>';
    }).join('');
  }

  let feedKey = '';
  function renderFeed(quanta) {
    const key = quanta.length ? `${quanta.length}|${quanta[0].term}.${quanta[0].seq}|${quanta[quanta.length - 1].seq}` : '0';
    if (key === feedKey) return;
    feedKey = key;
    $('feed').innerHTML = quanta.map((q) => {
      const ops = q.ops || [];
      const shown = ops.slice(0, 3).map(esc).join('<br>') + (ops.length > 3 ? `<br>+${ops.length - 3} more` : '');
      const by = String(q.by || '');
      return `<li data-seq="${esc(q.seq)}" data-cause="${esc(q.cause)}"><div class="head">` +
        `<span class="seq" title="term ${esc(q.term)}, generation ${esc(q.generation)}">#${esc(q.seq)}</span><span class="time">${esc(fmtTime(Date.parse(q.time)))}</span>` +
        `<span class="cause">${esc(q.cause)}</span><span class="by" title="${esc(by)}">${esc(by.replace(/^spiffe:\/\/[^/]+\//, ''))}</span>` +
        `</div><div class="ops" title="${esc(ops.join('\n'))}">${shown}</div></li>`;
    }).join('');
    sp.feedCount = quanta.length;
    $('feed-count').textContent = `(${quanta.length})`;
  }

  // ---------- live updates ----------
  let es = null;
  let live = false;
  function setLive(up) {
    live = up;
    const c = $('conn');
    c.textContent = up ? 'live' : 'disconnected';
    c.className = 'conn ' + (up ? 'up' : 'down');
  }
  function connect() {
    const src = new EventSource('api/events');
    es = src;
    src.addEventListener('open', () => {
      setLive(true);
      stateLoader.kick();
      if (view.follow) heatLoader.kick();
    });
    src.addEventListener('update', (ev) => {
      let d = null;
      try { d = JSON.parse(ev.data); } catch (e) { d = null; }
      if (d && num(d.last) > lastSeq) lastSeq = num(d.last);
      stateLoader.kick();
      if (view.follow && !standby) heatLoader.kick();
    });
    src.addEventListener('error', () => {
      setLive(false);
      // A stream the server refused (an HTTP error) is not retried by the browser. A standby
      // may refuse it for good: then the state poll finds the new leader, and reconnects.
      if (src.readyState === EventSource.CLOSED) {
        src.close();
        if (es === src) es = null;
        setTimeout(() => { if (!es && !standby) connect(); }, 5000);
      }
    });
  }

  // ---------- controls ----------
  function syncControls() {
    $('node-label').hidden = ui.mode !== 'role';
    $('scale-label').hidden = ui.mode !== 'load';
  }
  $('mode').addEventListener('change', (e) => { ui.mode = e.target.value; syncControls(); draw(); heatLoader.kick(true); });
  $('node-select').addEventListener('change', (e) => { ui.node = e.target.value; heatLoader.kick(true); });
  $('scale').addEventListener('change', (e) => { ui.scale = e.target.value; draw(); });
  $('show-events').addEventListener('change', (e) => { ui.events = e.target.checked; draw(); });

  let resizeTimer = 0, lastSize = '';
  new ResizeObserver(() => {
    draw(); // the overlay follows the box at once; the grid catches up below
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      const s = gridSize(), k = `${s.w}x${s.h}`;
      if (lastSize && k !== lastSize) heatLoader.kick(true);
      lastSize = k;
    }, 250);
  }).observe(box);

  // A slow fallback for when the event stream is down, and to age the "last seen" column.
  let polls = 0;
  setInterval(() => {
    polls++;
    if (live && polls % 2) return;
    stateLoader.kick();
    if (!live && view.follow) heatLoader.kick();
  }, 5000);

  syncControls();
  lastSize = (() => { const s = gridSize(); return `${s.w}x${s.h}`; })();
  // The event stream opens once the first state says this is the leader: a standby may
  // refuse it, and each refusal would be an error in the console.
  stateLoader.kick(true);
})();
