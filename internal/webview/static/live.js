// Keeping the page live: the state, the event stream that says when to ask for it again,
// and a slow poll for when the stream is down. A standby assigner has no history to show,
// so the state decides whether the heatmap and the stream run at all.
import { $ } from './dom.js';
import { api, coalesced, getJSON, setError } from './api.js';
import { num } from './format.js';
import { sp, view, seen, debugOut } from './state.js';
import { heatLoader, heatMessage, clearHeatmap } from './heatmap.js';
import { renderStatus, renderNodes, renderPasses, renderFeed } from './panels.js';

export const stateLoader = coalesced('state', async () => {
  applyState(await getJSON('api/state'));
}, 500);

function applyState(s) {
  const t0 = performance.now();
  applyState1(s);
  sp.lastStateMs = performance.now() - t0;
  debugOut();
}
function applyState1(s) {
  const wasStandby = seen.standby, first = !seen.haveState;
  seen.standby = s.leader === false;
  seen.haveState = true;
  const note = $('leader-note');
  if (seen.standby) {
    if (!wasStandby) {
      clearHeatmap();
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
  if (h.first) seen.firstSeq = num(h.first);
  if (num(h.last) > seen.lastSeq) seen.lastSeq = num(h.last);
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

let es = null;
let live = false;
function setLive(up) {
  live = up;
  const c = $('conn');
  c.textContent = up ? 'live' : 'disconnected';
  c.className = 'conn ' + (up ? 'up' : 'down');
}
function connect() {
  const src = new EventSource(api('api/events'));
  es = src;
  src.addEventListener('open', () => {
    setLive(true);
    stateLoader.kick();
    if (view.follow) heatLoader.kick();
  });
  src.addEventListener('update', (ev) => {
    let d = null;
    try { d = JSON.parse(ev.data); } catch (e) { d = null; }
    if (d && num(d.last) > seen.lastSeq) seen.lastSeq = num(d.last);
    stateLoader.kick();
    if (view.follow && !seen.standby) heatLoader.kick();
  });
  src.addEventListener('error', () => {
    setLive(false);
    // A stream the server refused (an HTTP error) is not retried by the browser. A standby
    // may refuse it for good: then the state poll finds the new leader, and reconnects.
    if (src.readyState === EventSource.CLOSED) {
      src.close();
      if (es === src) es = null;
      setTimeout(() => { if (!es && !seen.standby) connect(); }, 5000);
    }
  });
}

// start asks for the first state. The event stream opens once that state says this is the
// leader: a standby may refuse it, and each refusal would be an error in the console.
export function start() {
  // A slow fallback for when the event stream is down, and to age the "last seen" column.
  let polls = 0;
  setInterval(() => {
    polls++;
    if (live && polls % 2) return;
    stateLoader.kick();
    if (!live && view.follow) heatLoader.kick();
  }, 5000);
  stateLoader.kick(true);
}
