// Sliceplane web view: the browser side of the contract in the assigner's /ui/ API.
// ES modules served as they are from the embedded files: no build step, no dependencies.
// Importing a module wires its listeners; nothing is asked of the server before start.
import './zoom.js';
import { initControls } from './controls.js';
import { start } from './live.js';
import { initTargets } from './targets.js';

initControls();
initTargets();
start();
