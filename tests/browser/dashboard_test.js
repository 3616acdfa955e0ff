// Drives Debian's chromium with playwright-core against a real `laissez serve`
// on loopback: operator and tenant views, live events after an order placed
// through the API, tenant isolation, a floor set from the page, an adaptive
// power cap from the CLI in the rows panel, reconnection after a server restart. Screenshots go to $ARTIFACTS (under the build dir).
'use strict';
const { chromium } = require('playwright-core');
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const net = require('net');
const path = require('path');
const assert = require('assert');

const BIN = process.env.LAISSEZ;
const ART = process.env.ARTIFACTS;
const WAIT = 30000;  // Upper bound for anything to show up; passing runs never wait this long.
const pageErrors = [];

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on('error', reject);
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let server = null;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lz-dash-'));
const db = path.join(tmp, 'market.db');
let grpcPort, httpPort;

async function startServer() {
  server = spawn(BIN, ['serve', '--db', db, '--listen', `127.0.0.1:${grpcPort}`, '--http', `127.0.0.1:${httpPort}`,
    '--tick-ms', '200'], { stdio: ['ignore', 'ignore', 'pipe'] });
  server.stderr.on('data', (d) => process.stderr.write('[serve] ' + d));
  for (let i = 0; i < 200; i++) {
    try {
      const r = await fetch(`http://127.0.0.1:${httpPort}/healthz`);
      if (r.ok) return;
    } catch (e) { /* not up yet */ }
    await sleep(100);
  }
  throw new Error('server did not come up');
}
async function stopServer() {
  if (!server) return;
  const s = server;
  server = null;
  const done = new Promise((r) => s.on('exit', r));
  s.kill('SIGTERM');
  await done;
}

function cli(tokenFile, ...args) {
  const out = execFileSync(BIN, [...args, '--server', `127.0.0.1:${grpcPort}`, '--token-file', tokenFile, '--json'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  return JSON.parse(out);
}
const read = (f) => fs.readFileSync(f, 'utf8').trim();
// A CLI call that must fail before it reaches the server, naming `field`.
function cliRefuses(tokenFile, field, ...args) {
  try {
    execFileSync(BIN, [...args, '--server', `127.0.0.1:${grpcPort}`, '--token-file', tokenFile],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    assert.notStrictEqual(e.status, 0);
    assert(e.stderr.includes(field + ':'), `${args.join(' ')}: stderr does not name ${field}: ${e.stderr}`);
    return;
  }
  assert.fail(`${args.join(' ')} was accepted`);
}

async function login(browser, token, name) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await ctx.newPage();
  page.on('pageerror', (e) => pageErrors.push(`${name}: ${e.message}`));
  await page.goto(`http://127.0.0.1:${httpPort}/dash/`);
  await page.fill('#token', token);
  await page.press('#token', 'Enter');
  await page.waitForSelector('#live.ok', { timeout: WAIT });
  return page;
}
const shot = (page, name) => page.screenshot({ path: path.join(ART, name + '.png'), fullPage: false });

async function main() {
  grpcPort = await freePort();
  httpPort = await freePort();
  await startServer();
  const admin = db + '.admin-token';
  const opFile = path.join(tmp, 'op.token');
  cli(admin, 'token', 'issue', '--role', 'operator', '--name', 'ops', '--out', opFile);
  // 12 h100 nodes over 2 rows x 2 racks, 4 a100 nodes in one rack.
  const nodes = [];
  for (const row of ['r1', 'r2']) for (const rack of ['k1', 'k2']) for (let i = 1; i <= 3; i++) {
    nodes.push(['h100', row, rack, `h-${row}-${rack}-${i}`]);
  }
  for (let i = 1; i <= 4; i++) nodes.push(['a100', 'r3', 'k1', `a-r3-k1-${i}`]);
  for (const [type, row, rack, name] of nodes) {
    cli(opFile, 'nodes', 'add', '--name', name, '--type', type, '--region', 'eu', '--zone', 'eu-1a', '--row', row,
      '--rack', rack, '--gpus', '8', '--memory-gb', '1024', '--power-w', '6000');
  }
  const acmeFile = path.join(tmp, 'acme.token'), betaFile = path.join(tmp, 'beta.token');
  cli(admin, 'tenant', 'create', 'acme', '--balance', '1000', '--token-out', acmeFile);
  cli(admin, 'tenant', 'create', 'betacorp', '--balance', '1000', '--token-out', betaFile);
  // betacorp holds one h100 node at a $5/h limit.
  const betaOrder = cli(betaFile, 'bid', '--scope', 'h100', '--price', '5');
  let held = null;
  for (let i = 0; i < 100 && !held; i++) {
    const h = cli(betaFile, 'holdings');
    held = (h.nodes || [])[0];
    if (!held) await sleep(100);
  }
  assert(held, 'betacorp got no node');
  const heldName = held.node || held.name;

  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
    // No --user-data-dir: Playwright refuses it with launch(); launch() starts
    // chromium on a fresh temporary profile of its own, and each login below
    // gets its own context (cookies and storage).
  });
  try {
    // --- Operator: the heatmap shows every node, held ones as held.
    const op = await login(browser, read(opFile), 'operator');
    await op.waitForSelector('#heatmap button.node', { timeout: WAIT });
    assert.strictEqual(await op.locator('#heatmap button.node').count(), 16, 'heatmap node count');
    assert.strictEqual(await op.locator('[data-testid="type-h100"] button.node').count(), 12);
    assert.strictEqual(await op.locator('[data-testid="type-a100"] button.node').count(), 4);
    assert.strictEqual(await op.locator(`#heatmap button[data-node="${heldName}"]`).getAttribute('data-status'), 'held');
    assert.match(await op.textContent('[data-testid="stat-revenue"]'), /\$\d+\.\d\d\/h/);
    assert.match(await op.textContent('[data-testid="stat-utilization"]'), /6\.3 %/);  // 1 of 16 held.
    assert.match(await op.textContent('#tz'), /Times in /);
    await shot(op, '01-operator');

    // --- A tenant view shows only its own things.
    const beta = await login(browser, read(betaFile), 'betacorp');
    await beta.waitForSelector(`#t-nodes td:text("${heldName}")`, { timeout: WAIT });

    // --- acme outbids betacorp's node through the API: a notice and a price change arrive live.
    const acmeOrder = cli(acmeFile, 'bid', '--scope', heldName, '--price', '9');
    await op.waitForSelector('#feed li[data-type="notice"]', { timeout: WAIT });
    await op.waitForSelector('#feed li[data-type="price_changed"]', { timeout: WAIT });
    await op.waitForSelector(`#heatmap button[data-node="${heldName}"][data-status="contested"]`, { timeout: WAIT });
    await shot(op, '02-operator-live');
    await beta.waitForSelector('#t-feed li[data-type="notice"]', { timeout: WAIT });
    await beta.waitForSelector('#t-nodes .grace', { timeout: WAIT });
    assert.match(await beta.textContent('#t-nodes .grace'), /\d+ s left/);
    await shot(beta, '03-tenant-betacorp');
    const acme = await login(browser, read(acmeFile), 'acme');
    await acme.waitForSelector('#t-orders td', { timeout: WAIT });
    await acme.fill('#watch-vertex', 'h100');
    await acme.press('#watch-vertex', 'Enter');
    await acme.waitForSelector('#t-quotes td:text("h100")', { timeout: WAIT });
    await acme.waitForSelector('#live.ok', { timeout: WAIT });  // Resubscribed with the watch, no outage shown.
    await sleep(500);
    await shot(acme, '04-tenant-acme');
    // Isolation: neither tenant's page holds the other's name or order ids.
    for (const [page, other, otherOrder] of [[beta, 'acme', acmeOrder.order], [acme, 'betacorp', betaOrder.order]]) {
      const html = await page.content();
      assert(!html.includes(other), `a tenant page mentions ${other}`);
      const orderCells = await page.locator('#t-orders tbody tr td:first-child').allTextContents();
      assert(!orderCells.includes(String(otherOrder)), `a tenant page lists order ${otherOrder} of ${other}`);
    }
    // A tenant token cannot read the operator view.
    const r = await fetch(`http://127.0.0.1:${httpPort}/api/v1/operator/overview`, { headers: { Authorization: 'Bearer ' + read(acmeFile) } });
    assert.strictEqual(r.status, 403);

    // --- Keyboard: the floor control is reachable with Tab alone.
    await op.focus('#hist-vertex');
    let reached = false;
    for (let i = 0; i < 60 && !reached; i++) {
      await op.keyboard.press('Tab');
      reached = await op.evaluate(() => document.activeElement && document.activeElement.id === 'floor-target');
    }
    assert(reached, 'the floor control is not reachable by keyboard');

    // --- Set a floor from the page, confirm, and see it take effect.
    await op.selectOption('#floor-target', 'eu/eu-1a/r2/k2');
    await op.fill('#floor-price', '3');
    await op.click('#floor-form button[type="submit"]');
    await op.waitForSelector('#confirm[open]', { timeout: WAIT });
    await shot(op, '05-floor-confirm');
    await op.click('#confirm-ok');
    await op.waitForSelector('#ctl-msg:has-text("Floor $3.00/h set")', { timeout: WAIT });
    await op.waitForSelector('#heatmap button[data-node="h-r2-k2-1"][title*="floor $3.00/h"]', { timeout: WAIT });
    const list = cli(opFile, 'nodes', 'list');
    const k2 = list.nodes.filter((n) => n.node.startsWith('h-r2-k2-'));
    assert.strictEqual(k2.length, 3);
    for (const n of k2) assert.strictEqual(Number(n.floor), 3000000, `floor on ${n.node}`);
    await shot(op, '06-floor-set');
    await op.screenshot({ path: path.join(ART, '06b-operator-full.png'), fullPage: true });

    // --- An adaptive power cap from the CLI on the held node's row: the rows
    // panel shows the controller's floor and target beside committed power.
    const heldRow = list.nodes.find((n) => n.node === heldName).location.split('/').slice(0, 3).join('/');
    const adaptive = ['powercap', 'adaptive', '--row', heldRow, '--cap-w', '50000', '--margin-ppm', '100000',
      '--band-ppm', '100000', '--interval', '1s', '--rise-min', '0.25', '--rise-max', '1', '--fall-step', '0.1',
      '--min-floor', '1.5', '--max-floor', '4'];
    for (const [flag, bad] of [['rise-min', 'abc'], ['rise-max', '-1'], ['fall-step', '0.0000001'], ['min-floor', 'inf'],
      ['max-floor', '1e3'], ['interval', 'soon']]) {
      const args = adaptive.slice();
      args[args.indexOf('--' + flag) + 1] = bad;
      cliRefuses(opFile, flag, ...args);
    }
    const cap = cli(opFile, ...adaptive);
    const ctl = `#rows [data-testid="controller"][data-policy="${cap.policy}"]`;
    await op.waitForSelector(`${ctl}:has-text("target 45.0 kW")`, { timeout: WAIT });
    assert.match(await op.textContent(ctl), /floor \$1\.50\/h/);
    // A cooling failure: the cap drops in place below the row's committed
    // power; the target follows at once and the floor rises from $1.50/h.
    cli(opFile, 'powercap', 'set-cap', String(cap.policy), '--cap-w', '4000');
    await op.waitForSelector(`${ctl}:has-text("target 3600 W")`, { timeout: WAIT });
    await op.waitForFunction((sel) => { const e = document.querySelector(sel); return e && !/floor \$1\.50\/h/.test(e.textContent); },
      ctl, { timeout: WAIT });
    await op.locator('#rows').scrollIntoViewIfNeeded();
    await shot(op, '06c-adaptive-cap');
    await op.screenshot({ path: path.join(ART, '06d-adaptive-cap-full.png'), fullPage: true });
    // An adaptive carbon budget from the CLI: bad flags are refused naming them.
    const budget = ['carbon', 'budget', '--region', 'eu', '--budget-g-per-h', '100000', '--intensity', '0=300',
      '--intensity', '6h=120', '--rise-min', '100', '--rise-max', '1000', '--min-price', '10'];
    for (const [flag, bad, field] of [['intensity', '0=lots', 'intensity[0].g'], ['intensity', 'soon=3', 'intensity[0].in'],
      ['rise-min', 'nan', 'rise-min'], ['max-price', '-5', 'max-price']]) {
      const args = budget.slice();
      if (flag === 'max-price') args.push('--max-price', bad); else args[args.indexOf('--' + flag) + 1] = bad;
      cliRefuses(opFile, field, ...args);
    }
    const carbonPolicy = cli(opFile, ...budget).policy;
    assert(Number.isInteger(carbonPolicy), 'carbon budget policy id');
    cli(opFile, 'carbon', 'set-budget', String(carbonPolicy), '--budget-g-per-h', '50000');

    // --- Restart the server: the page says it is stale, then reconnects by itself.
    await stopServer();
    await op.waitForSelector('#live.stale', { timeout: WAIT });
    await shot(op, '07-reconnecting');
    await startServer();
    await op.waitForSelector('#live.ok', { timeout: WAIT });
    assert.strictEqual(await op.locator('#heatmap button.node').count(), 16);
    await op.waitForSelector(`${ctl}:has-text("target 3600 W")`, { timeout: WAIT });  // Journaled.
    assert.deepStrictEqual(pageErrors, [], 'errors in the page');
  } finally {
    await browser.close();
  }
  console.log('dashboard browser test: all checks passed; screenshots in ' + ART);
}

main().then(async () => { await stopServer(); fs.rmSync(tmp, { recursive: true, force: true }); },
  async (e) => { console.error(e); await stopServer(); process.exit(1); });
