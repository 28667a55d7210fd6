// The target picker: the control plane's targets with their leaders (api/targets), the page's
// own selected; choosing another loads the page for it.
import { $ } from './dom.js';
import { getJSON, setError, target } from './api.js';

export async function initTargets() {
  const sel = $('target');
  sel.addEventListener('change', () => {
    const q = new URLSearchParams(location.search);
    if (sel.value === 'default') q.delete('target'); else q.set('target', sel.value);
    location.search = q.toString();
  });
  let list;
  try {
    list = await getJSON('api/targets');
  } catch (e) {
    setError('targets', e.message);
    return;
  }
  setError('targets', '');
  for (const t of list.targets) {
    const o = document.createElement('option');
    o.value = t.name;
    o.textContent = `${t.name} (leader ${t.leader || 'unknown'})`;
    o.selected = t.name === (target || 'default');
    sel.append(o);
  }
}
