// LaissezCloud market dashboard. Plain DOM + uPlot; talks to the server's
// /api/v1 JSON endpoints and its Server-Sent Events stream with the bearer
// token the user pasted (kept in sessionStorage, never in a URL).
import uPlot from 'uplot';

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem('lz_token') || '', me: null, offsetUs: 0, data: null,
  histVertex: '', watch: JSON.parse(localStorage.getItem('lz_watch') || '[]'), chart: null, lastMsg: 0,
  connected: false, refreshTimer: null };

// ---- Formatting: every number carries its unit; times in the viewer's zone.
const MICRO = 1e6;
function money(micro) {
  if (micro === null || micro === undefined) return '—';
  return '$' + (micro / MICRO).toLocaleString(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 2 });
}
function rate(micro) { return micro === null || micro === undefined ? 'none' : money(micro) + '/h'; }
function clock(us) {
  return new Date(us / 1000).toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}
function serverNowUs() { return Date.now() * 1000 + state.offsetUs; }
function secondsLeft(deadlineUs) { return Math.max(0, Math.round((deadlineUs - serverNowUs()) / 1e6)); }
function watts(w) { return w >= 10000 ? (w / 1000).toFixed(1) + ' kW' : w + ' W'; }
function esc(s) { return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c])); }
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k.startsWith('data-') || k.startsWith('aria-')) e.setAttribute(k, v); else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
}
function table(headers, rows) {
  let h = '<table><thead><tr>' + headers.map(([t, num]) => `<th${num ? ' class="num"' : ''}>${esc(t)}</th>`).join('') + '</tr></thead><tbody>';
  for (const r of rows) h += '<tr>' + r.map((c, i) => `<td${headers[i][1] ? ' class="num"' : ''}>${c}</td>`).join('') + '</tr>';
  if (!rows.length) h += `<tr><td colspan="${headers.length}" class="muted">none</td></tr>`;
  return h + '</tbody></table>';
}

// ---- API
async function api(path, opts = {}) {
  const res = await fetch(path, { ...opts, headers: { ...(opts.headers || {}), Authorization: 'Bearer ' + state.token } });
  const body = await res.json().catch(() => ({ error: 'bad response (' + res.status + ')' }));
  if (!res.ok) throw new Error(body.error || 'HTTP ' + res.status);
  return body;
}

// ---- Live feed over SSE (fetch-based so the token goes in a header). The
// page reconnects by itself and says so when it has heard nothing lately.
function setLive(ok, text) {
  const l = $('live');
  l.className = 'live ' + (ok ? 'ok' : 'stale');
  l.textContent = text;
}
async function streamLoop() {
  for (;;) {
    const watch = state.me.role === 'tenant' ? '?watch=' + encodeURIComponent(state.watch.join(',')) : '';
    const controller = new AbortController();
    state.abort = controller;
    try {
      const res = await fetch('/api/v1/events' + watch, { headers: { Authorization: 'Bearer ' + state.token }, signal: controller.signal });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const chunk = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let ev = 'message', data = '';
          for (const line of chunk.split('\n')) {
            if (line.startsWith('event:')) ev = line.slice(6).trim();
            else if (line.startsWith('data:')) data += line.slice(5).trim();
          }
          state.lastMsg = Date.now();
          if (ev === 'hello') { state.connected = true; setLive(true, 'Live'); refreshSoon(0); }
          else if (ev === 'message' && data) onEvent(JSON.parse(data));
        }
      }
    } catch (e) {
      if (state.stopped) return;
    }
    if (state.stopped) return;
    if (state.resubscribe) { state.resubscribe = false; continue; }  // A new watch set, not an outage.
    state.connected = false;
    setLive(false, 'Reconnecting… last update ' + (state.lastMsg ? new Date(state.lastMsg).toLocaleTimeString() : 'never'));
    await new Promise((r) => setTimeout(r, 2000));
  }
}
// A heartbeat arrives every 3 s; 8 s of silence means the data may be stale.
setInterval(() => {
  if (!state.me) return;
  if (state.connected && Date.now() - state.lastMsg > 8000) {
    setLive(false, 'Stale: no update since ' + new Date(state.lastMsg).toLocaleTimeString());
    if (state.abort) state.abort.abort();
  }
  tickCountdowns();
}, 1000);

function describe(e) {
  const parts = [];
  if (e.node) parts.push('node ' + e.node);
  if (e.vertex) parts.push('at ' + e.vertex);
  if (e.type === 'price_changed') parts.push('quote ' + rate(e.price));
  else if (e.price) parts.push(rate(e.price));
  if (e.amount) parts.push('paid ' + money(e.amount));
  if (e.tenant) parts.push('tenant ' + e.tenant);
  if (e.other) parts.push('from ' + e.other);
  if (e.deadline && e.type === 'notice') parts.push('grace ends ' + clock(e.deadline) + ' (' + secondsLeft(e.deadline) + ' s left)');
  if (e.reasons) parts.push('(' + e.reasons + ')');
  if (e.cancel_reason) parts.push('(' + e.cancel_reason + ')');
  return parts.join(' · ');
}
function onEvent(e) {
  const feed = state.me.role === 'tenant' ? $('t-feed') : $('feed');
  if (e.type !== 'charged' || state.me.role === 'tenant') {
    const li = el('li', { 'data-type': e.type });
    li.append(el('span', { class: 't' }, clock(e.time)), el('span', { class: 'ev ev-' + e.type }, e.type.replace('_', ' ')), document.createTextNode(describe(e)));
    feed.prepend(li);
    while (feed.children.length > 200) feed.lastChild.remove();
  }
  if (e.type === 'price_changed' && e.vertex === state.histVertex) loadHistory(state.histVertex);
  refreshSoon(400);
}
function refreshSoon(ms) {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refresh(); }, ms);
}

// ---- Operator view
function color(price, lo, hi, light) {
  if (price === null || price === undefined) return '#9aa6b2';
  const f = hi > lo ? (price - lo) / (hi - lo) : 0.5;
  const hue = 210 - 210 * f;  // blue (cheap) to red (dear)
  return `hsl(${hue.toFixed(0)}, 70%, ${light ? 88 : 42}%)`;
}
const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
function renderOperator(d) {
  const t = d.totals;
  $('totals').innerHTML = [
    ['Nodes', plural(t.nodes, 'node', 'nodes'), 'nodes'], ['Utilization', (t.utilization_ppm / 1e4).toFixed(1) + ' %', 'utilization'],
    ['Revenue', rate(t.revenue_per_hour), 'revenue'], ['Nodes in grace', plural(t.nodes_in_grace, 'node', 'nodes'), 'grace'],
    ['Free / held / contested', `${t.free} / ${t.held} / ${t.contested}`, 'states'], ['Tenants', plural(t.tenants, 'tenant', 'tenants'), 'tenants'],
    ['Resting orders', plural(t.resting_orders, 'order', 'orders'), 'orders'], ['Revenue to date', money(t.operator_revenue), 'paid'],
  ].map(([k, v, id]) => `<div class="stat" data-testid="stat-${id}"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div></div>`).join('');

  const heat = $('heatmap');
  // Keep keyboard focus on the same node across re-renders.
  const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.node : null;
  heat.textContent = '';
  const vertices = [], racks = [], locations = new Set();
  for (const ty of d.types) {
    const prices = [];
    for (const z of ty.zones) for (const r of z.rows) for (const k of r.racks) for (const n of k.nodes) if (n.price !== null) prices.push(n.price);
    const lo = Math.min(...prices), hi = Math.max(...prices);
    const box = el('div', { class: 'type', 'data-testid': 'type-' + ty.type });
    box.append(el('h3', {}, `${ty.type} — ${ty.total} nodes, quote ${rate(ty.quote)}` + (prices.length ? `, prices ${rate(lo)} to ${rate(hi)}` : '')));
    vertices.push(ty.type);
    for (const z of ty.zones) {
      const zd = el('div', { class: 'zone' });
      zd.append(el('div', { class: 'zone-name' }, z.path));
      vertices.push(ty.type + '/' + z.path); locations.add(z.path);
      for (const r of z.rows) {
        const rd = el('div', { class: 'row' });
        rd.append(el('div', { class: 'row-name', title: r.path }, r.path.split('/').pop()));
        vertices.push(ty.type + '/' + r.path); locations.add(r.path);
        const rk = el('div', { class: 'racks' });
        for (const k of r.racks) {
          racks.push(k.path); locations.add(k.path);
          const kd = el('div', { class: 'rack', role: 'group', 'aria-label': 'rack ' + k.path });
          for (const n of k.nodes) {
            const label = `${n.name}: ${n.status}, ${n.status === 'free' ? 'quote' : 'pays'} ${rate(n.price)}` +
              (n.holder ? `, held by ${n.holder}` : '') + (n.floor ? `, floor ${rate(n.floor)}` : '') +
              (n.deadline ? `, grace ${secondsLeft(n.deadline)} s left` : '');
            const b = el('button', { type: 'button', class: `node ${n.status}` + (n.vertex === state.histVertex ? ' sel' : ''),
              title: label, 'aria-label': label, 'data-node': n.name, 'data-status': n.status });
            // Held nodes solid, free ones a pale tint of their quote (white when it is zero).
            if (n.status !== 'free') b.style.background = color(n.price, lo, hi, false);
            else if (n.price) b.style.setProperty('background', color(n.price, lo, hi, true), 'important');
            b.textContent = n.status === 'contested' ? '!' : n.status === 'reserved' ? 'r' : '';
            b.addEventListener('click', () => { $('hist-vertex').value = n.vertex; loadHistory(n.vertex); });
            kd.append(b);
          }
          rk.append(kd);
        }
        rd.append(rk); zd.append(rd);
      }
      box.append(zd);
    }
    heat.append(box);
  }
  if (focused) { const b = heat.querySelector(`button[data-node="${CSS.escape(focused)}"]`); if (b) b.focus(); }
  $('vertex-list').innerHTML = vertices.map((v) => `<option value="${esc(v)}">`).join('');
  fillSelect($('floor-target'), [...locations].sort());
  fillSelect($('drain-target'), racks);
  if (!state.histVertex && d.types.length) { $('hist-vertex').value = d.types[0].type; loadHistory(d.types[0].type); }

  $('rows').innerHTML = table([['Row'], ['Committed power', 1], ['Cap', 1], ['Of cap'], ['Adaptive controller'], ['Floor in force', 1]], d.rows.map((r) => {
    const frac = r.cap_w ? r.committed_w / r.cap_w : (r.power_w ? r.committed_w / r.power_w : 0);
    const pct = Math.min(100, Math.round(frac * 100));
    const floor = r.floor_min === r.floor_max ? rate(r.floor_max) : `${rate(r.floor_min)} to ${rate(r.floor_max)}`;
    // Each adaptive cap: its floor F, its target T and the staying power S it
    // measured at its last step (docs/MECHANISM.md, "Adaptive power caps").
    const ctl = (r.adaptive || []).map((a) =>
      `<div class="ctl" data-testid="controller" data-policy="${a.policy}" title="policy ${a.policy}: cap ${watts(a.cap_w)}, hold band down to ${watts(a.low_w)}, next step ${clock(a.next_step)}">` +
      `floor <b>${esc(rate(a.floor))}</b><br>target ${watts(a.target_w)}<br>staying ${watts(a.staying_w)}</div>`).join('');
    return [esc(r.path), `${watts(r.committed_w)} of ${watts(r.power_w)}`, r.cap_w ? watts(r.cap_w) : 'no cap',
      `<div class="bar${frac > 0.9 ? ' hot' : ''}" role="img" aria-label="${pct} % of ${r.cap_w ? 'cap' : 'installed power'}"><span style="width:${pct}%"></span></div> ${pct} %`,
      ctl || '<span class="muted">none</span>', esc(floor)];
  }));
}
function fillSelect(sel, values) {
  const cur = sel.value;
  const want = values.join('\n');
  if (sel.dataset.values === want) return;
  sel.dataset.values = want;
  sel.innerHTML = values.map((v) => `<option>${esc(v)}</option>`).join('');
  if (values.includes(cur)) sel.value = cur;
}

async function loadHistory(vertex) {
  state.histVertex = vertex;
  const target = state.me.role === 'tenant' ? $('t-chart') : $('chart');
  try {
    const h = await api('/api/v1/history?vertex=' + encodeURIComponent(vertex));
    state.histVertex = h.vertex;
    const xs = [], ys = [];
    for (const [t, p] of h.points) { xs.push(t / 1e6); ys.push(p === null ? null : p / MICRO); }
    xs.push(h.now / 1e6); ys.push(h.quote === null ? null : h.quote / MICRO);
    const now = state.me.role === 'tenant' ? null : $('hist-now');
    if (now) now.textContent = `${h.vertex}: quote now ${rate(h.quote)}; ${h.points.length} changes since the server started`;
    target.textContent = '';
    if (state.chart) state.chart.destroy();
    const width = Math.max(300, target.clientWidth || target.parentElement.clientWidth - 24);
    state.chart = new uPlot({ width, height: 200, title: 'Quote at ' + h.vertex + ' ($/h)',
      series: [{}, { label: 'quote ($/h)', stroke: '#1d5fd1', width: 2, paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => v === null ? 'none' : '$' + v.toFixed(2) + '/h' }],
      axes: [{}, { size: 84, values: (u, vs) => vs.map((v) => '$' + v.toFixed(2) + '/h') }] }, [xs, ys], target);
  } catch (e) { target.textContent = e.message; }
}

function confirmDialog(text) {
  return new Promise((resolve) => {
    const d = $('confirm');
    $('confirm-text').textContent = text;
    d.returnValue = '';
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.showModal();
    $('confirm-ok').focus();
  });
}
$('floor-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const location = $('floor-target').value, dollars = Number($('floor-price').value);
  if (!location || !(dollars >= 0)) return;
  const price = Math.round(dollars * MICRO);
  if (!(await confirmDialog(`Set a floor of ${rate(price)} on every node under ${location}? Holders whose limit is below it get a notice.`))) {
    $('ctl-msg').textContent = 'Cancelled.'; return;
  }
  try {
    const r = await api('/api/v1/operator/floor', { method: 'POST', body: JSON.stringify({ location, price }) });
    $('ctl-msg').textContent = `Floor ${rate(price)} set at ${location} (policy ${r.policy}).`;
    refreshSoon(0);
  } catch (e) { $('ctl-msg').textContent = 'Failed: ' + e.message; }
});
$('drain-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const location = $('drain-target').value;
  if (!location) return;
  if (!(await confirmDialog(`Drain rack ${location}? Its holders get notices and lose the nodes when their grace ends; the rack takes no new work.`))) {
    $('ctl-msg').textContent = 'Cancelled.'; return;
  }
  try {
    const r = await api('/api/v1/operator/drain', { method: 'POST', body: JSON.stringify({ location }) });
    $('ctl-msg').textContent = `Rack ${location} draining (policy ${r.policy}).`;
    refreshSoon(0);
  } catch (e) { $('ctl-msg').textContent = 'Failed: ' + e.message; }
});
$('hist-form').addEventListener('submit', (ev) => { ev.preventDefault(); loadHistory($('hist-vertex').value.trim()); });

// ---- Tenant view
function renderTenant(d) {
  $('t-totals').innerHTML = [
    ['Tenant', d.tenant, 'tenant'], ['Balance', money(d.balance), 'balance'], ['Available', money(d.available), 'available'],
    ['Spend rate', rate(d.spend_rate), 'spend'], ['Committed rate', rate(d.committed_rate), 'committed'],
    ['Rate cap', rate(d.max_rate), 'cap'], ['Paid to date', money(d.paid), 'paid'],
  ].map(([k, v, id]) => `<div class="stat" data-testid="stat-${id}"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div></div>`).join('') +
    (d.exhausted ? '<div class="stat error" role="alert">Out of money: orders cancelled</div>' : '');
  $('t-nodes').innerHTML = table([['Node'], ['Location'], ['Pays', 1], ['My limit', 1], ['Competing', 1], ['Headroom', 1], ['Floor', 1], ['Grace']],
    d.nodes.map((n) => [esc(n.name) + `<br><span class="muted">${esc(n.type)}</span>`, esc(n.location), rate(n.pays), rate(n.limit), rate(n.competing),
      rate(Math.max(0, n.limit - Math.max(n.competing, n.floor))), rate(n.floor),
      n.contested ? `<span class="grace" data-deadline="${n.deadline}">${secondsLeft(n.deadline)} s left</span><br><span class="muted">ends ${clock(n.deadline)}</span>` : 'safe']));
  $('t-orders').innerHTML = table([['Order', 1], ['Scope'], ['Bid', 1], ['Effective', 1], ['Nodes', 1], ['State']],
    d.orders.map((o) => [o.id, esc(o.scope), rate(o.price), rate(o.effective_price), `${o.filled} of ${o.count}`, esc(o.state)]));
  $('t-quotes').innerHTML = table([['Vertex'], ['Quote', 1], ['Free', 1], ['Held', 1], ['Contested', 1], ['']],
    d.quotes.map((q) => q.error ? [esc(q.vertex), esc(q.error), '', '', '', ''] :
      [esc(q.vertex), rate(q.quote), plural(q.free, 'node', 'nodes'), plural(q.held, 'node', 'nodes'), plural(q.contested, 'node', 'nodes'),
        `<button type="button" data-hist="${esc(q.vertex)}">History</button> <button type="button" data-unwatch="${esc(q.vertex)}">Unwatch</button>`]));
  $('t-ledger').innerHTML = table([['From'], ['To'], ['Node'], ['Rate', 1], ['Amount', 1], ['Waived', 1]],
    d.ledger.map((l) => [clock(l.from), clock(l.time), esc(l.node || ''), rate(l.rate), money(l.amount), money(l.waived)]));
  $('t-vertex-list').innerHTML = d.types.map((v) => `<option value="${esc(v)}">`).join('');
  if (!state.histVertex && d.quotes.length && !d.quotes[0].error) loadHistory(d.quotes[0].vertex);
}
$('t-quotes').addEventListener('click', (ev) => {
  const h = ev.target.dataset.hist, u = ev.target.dataset.unwatch;
  if (h) loadHistory(h);
  if (u) setWatch(state.watch.filter((v) => v !== u));
});
$('watch-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const v = $('watch-vertex').value.trim();
  if (v && !state.watch.includes(v)) setWatch([...state.watch, v]);
  $('watch-vertex').value = '';
});
function setWatch(list) {
  state.watch = list;
  localStorage.setItem('lz_watch', JSON.stringify(list));
  state.resubscribe = true;
  if (state.abort) state.abort.abort();  // Resubscribe with the new set.
  refreshSoon(0);
}
function tickCountdowns() {
  for (const s of document.querySelectorAll('[data-deadline]')) s.textContent = secondsLeft(Number(s.dataset.deadline)) + ' s left';
}

// ---- Lifecycle
async function refresh() {
  if (!state.me) return;
  try {
    const d = state.me.role === 'tenant'
      ? await api('/api/v1/tenant/overview?watch=' + encodeURIComponent(state.watch.join(',')))
      : await api('/api/v1/operator/overview');
    state.offsetUs = d.now - Date.now() * 1000;
    state.data = d;
    if (state.me.role === 'tenant') renderTenant(d); else renderOperator(d);
  } catch (e) {
    if (!state.connected) {
      setLive(false, 'Stale: server unreachable, reconnecting… last update ' +
        (state.lastMsg ? new Date(state.lastMsg).toLocaleTimeString() : 'never'));
    }
  }
}
setInterval(() => refreshSoon(0), 5000);

async function login(token) {
  state.token = token;
  try {
    state.me = await api('/api/v1/me');
  } catch (e) {
    state.me = null;
    $('login-error').textContent = 'Log in failed: ' + e.message;
    return;
  }
  sessionStorage.setItem('lz_token', token);
  $('login').hidden = true;
  $('logout').hidden = false;
  $('who').textContent = `${state.me.name} (${state.me.role})`;
  $(state.me.role === 'tenant' ? 'tenant' : 'operator').hidden = false;
  await refresh();
  streamLoop();
}
$('login-form').addEventListener('submit', (ev) => { ev.preventDefault(); $('login-error').textContent = ''; login($('token').value.trim()); });
$('logout').addEventListener('click', () => { sessionStorage.removeItem('lz_token'); state.stopped = true; location.reload(); });
$('tz').textContent = 'Times in ' + Intl.DateTimeFormat().resolvedOptions().timeZone;
if (state.token) login(state.token); else $('token').focus();
