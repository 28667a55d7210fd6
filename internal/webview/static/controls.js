// The controls above the heatmap, and its size. A change of colouring redraws at once from
// the grid in hand (the legend and overlay follow) while the grid for it is fetched.
import { $, box } from './dom.js';
import { ui } from './state.js';
import { draw, gridSize, heatLoader } from './heatmap.js';

function syncControls() {
  $('node-label').hidden = ui.mode !== 'role';
  $('scale-label').hidden = ui.mode !== 'load';
}
$('mode').addEventListener('change', (e) => { ui.mode = e.target.value; syncControls(); draw(); heatLoader.kick(true); });
$('node-select').addEventListener('change', (e) => { ui.node = e.target.value; heatLoader.kick(true); });
$('scale').addEventListener('change', (e) => { ui.scale = e.target.value; draw(); });
$('show-events').addEventListener('change', (e) => { ui.events = e.target.checked; draw(); });

// The grid is one cell a pixel: a new size needs a new grid, but not one per resize event.
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

// initControls matches the controls to the state, and takes the size the first grid is for.
export function initControls() {
  syncControls();
  lastSize = (() => { const s = gridSize(); return `${s.w}x${s.h}`; })();
}
