// The web console in a real browser (Debian's headless Chromium, driven by
// playwright-core) against a running PicoMQ with auth on: sign in with a token, see a
// stream created through the API in the list, open it, see a record appended through
// the API arrive in the live tail within a second, append from the console and read
// it back through the API, see a consumer group's lag move, and be refused, in words,
// what a weaker token may not do. No secret may appear in any URL the page requests.
// Names are sent as they are stored (a %25 in one stays %25), and a #/stream/ link
// with dot segments gets no page to act from.
// Screenshots of each page go to SHOTS_DIR; with DOCS_DIR, the README's two
// screenshots (overview, stream page) are written there too.
//
// Usage: node console.mjs API_URL ADMIN_PORT_URL ADMIN_TOKEN READER_TOKEN SHOTS_DIR [DOCS_DIR]
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const [api, adminUrl, adminToken, readerToken, shots, docs] = process.argv.slice(2);
const STREAM = "console/orders";
const started = Date.now();
const fail = (msg) => {
  console.error(`FAIL (console, ${((Date.now() - started) / 1000).toFixed(1)} s): ${msg}`);
  process.exit(1);
};
mkdirSync(shots, { recursive: true });

// The API as a client other than the page: with the admin token, in Node.
async function call(method, path, { headers = {}, body } = {}) {
  const r = await fetch(api + path, {
    method,
    headers: { authorization: `Bearer ${adminToken}`, ...headers },
    body,
  });
  if (!r.ok) fail(`${method} ${path}: ${r.status} ${await r.text()}`);
  return r;
}
const appendJson = (value) =>
  call("POST", "/" + STREAM, { headers: { "content-type": "application/json" }, body: JSON.stringify(value) });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let traffic = null;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, colorScheme: "light" });
  const page = await context.newPage();
  const urls = [];
  const pageErrors = [];
  page.on("request", (r) => urls.push(r.url()));
  page.on("pageerror", (e) => pageErrors.push(e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !/status of (40[134]|410)/.test(m.text())) pageErrors.push(m.text());
  });
  const shot = async (name, target = page) => {
    const file = `${shots}/${name}.png`;
    await target.screenshot({ path: file, fullPage: true });
    console.log(`screenshot ${file}`);
  };
  const textOf = (sel, target = page) => target.locator(sel).first().innerText();
  const waitText = async (sel, re, ms = 8000, target = page) => {
    try {
      await target.waitForFunction(({ sel, src }) => {
        const el = document.querySelector(sel);
        return el && new RegExp(src).test(el.innerText);
      }, { sel, src: re.source }, { timeout: ms, polling: 50 });
    } catch (_) {
      const now = await target.locator(sel).first().innerText().catch(() => "(absent)");
      fail(`${sel} never matched /${re.source}/ within ${ms} ms; it says: ${now}`);
    }
  };

  // Some traffic so the overview's charts have something to draw.
  await call("PUT", "/console/load", { headers: { "content-type": "text/plain" } });
  let stop = false;
  traffic = (async () => {
    for (let i = 0; !stop; i++) {
      await fetch(`${api}/console/load`, {
        method: "POST",
        headers: { authorization: `Bearer ${adminToken}`, "content-type": "text/plain" },
        body: `event ${i} `.repeat(1 + (i % 20)),
      }).catch(() => {});
      await new Promise((r) => setTimeout(r, 20 + 30 * Math.abs(Math.sin(i / 40))));
    }
  })();
  traffic.stop = () => { stop = true; };

  // No token yet: the console says one is needed.
  const first = await page.goto(api + "/__picomq/console");
  const csp = first.headers()["content-security-policy"] || "";
  if (!csp.includes("default-src 'self'")) fail(`no strict CSP on the page: ${csp}`);
  await waitText("#banner", /requires a token/);
  await waitText("#overview-msg", /needs a token/);

  // Sign in on the Access page.
  await page.click('nav a[data-page="access"]');
  await page.fill("#login-token", adminToken);
  await page.click("#login-submit");
  await waitText("#login-msg", /Signed in/);
  await waitText("#probe-table", /Manage tokens\s+yes/);
  await waitText("#tokens-table", /tok_/);
  console.log("signed in with the admin token; every probe allowed, tokens listed");

  // A stream created through the API appears in the list.
  await call("PUT", "/" + STREAM, { headers: { "content-type": "application/json" } });
  await appendJson({ id: 1, item: "first order" });
  await page.click('nav a[data-page="streams"]');
  await waitText("#streams-table", /console\/orders/, 8000);
  await page.fill("#streams-prefix", "console/");
  await waitText("#streams-table", /console\/load/);
  console.log("the stream created through the API is in the list");
  await shot("streams");

  // Open it; a record appended through the API reaches the live tail within a second.
  await page.click(`#streams-table a[href="#/stream/${encodeURIComponent(STREAM)}"]`);
  await waitText("#tail-msg", /Following/);
  await waitText("#read-list", /first order/);
  const sent = Date.now();
  await appendJson({ id: 2, item: "live from the API" });
  await waitText("#tail-list", /live from the API/, 1000);
  const tailMs = Date.now() - sent;
  console.log(`record appended through the API shown in the live tail after ${tailMs} ms`);

  // Append from the console, read it back through the API.
  await page.selectOption("#append-mode", "json");
  await page.fill("#append-body", '{"id": 3, "item": "from the console"}');
  await page.click("#append-submit");
  await waitText("#append-msg", /Appended as record #2/);
  await waitText("#tail-list", /from the console/);
  const all = await (await call("GET", `/${STREAM}?offset=-1`)).json();
  if (!all.some((m) => m.item === "from the console")) fail(`the console's append is not in the stream: ${JSON.stringify(all)}`);
  console.log(`appended from the console; the API reads ${JSON.stringify(all[all.length - 1])}`);
  // A binary stream shows bytes as hex.
  await call("PUT", "/console/bytes", { headers: { "content-type": "application/octet-stream" } });
  await call("POST", "/console/bytes", { headers: { "content-type": "application/octet-stream" }, body: new Uint8Array([0, 1, 2, 255, 80, 77, 81]) });
  await page.waitForTimeout(300);
  await shot("stream");
  await page.goto(api + "/__picomq/console#/stream/" + encodeURIComponent("console/bytes"));
  await waitText("#read-list", /00 01 02 ff 50 4d 51 +\.\.\.\.PMQ/);
  console.log("a binary record is shown as a hex dump");
  // A name is its path as sent: a percent-escape in it goes back as it is, not twice.
  await call("PUT", "/console/50%25off", { headers: { "content-type": "text/plain" } });
  await call("POST", "/console/50%25off", { headers: { "content-type": "text/plain" }, body: "half price" });
  await page.goto(api + "/__picomq/console#/stream/" + encodeURIComponent("console/50%25off"));
  await waitText("#read-list", /half price/);
  // A link with dot segments must not let the page's buttons act on another path.
  await call("PUT", "/victim", { headers: { "content-type": "text/plain" } });
  await page.goto(api + "/__picomq/console#/stream/" + encodeURIComponent("console/../victim"));
  await waitText("#stream-msg", /not a stream name/);
  if (await page.locator("#delete-stream").count()) fail("a dot-segment name got a stream page with buttons");
  const strayed = urls.find((u) => u.startsWith(api + "/victim"));
  if (strayed) fail(`the page requested ${strayed}`);
  console.log("a name with %25 opens its stream; a name with .. is refused, nothing requested");
  await page.goto(api + `/__picomq/console#/stream/${encodeURIComponent(STREAM)}`);

  // A consumer group's lag moves as the stream grows and as messages are claimed.
  await call("PUT", "/__picomq/groups/billing", {
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ stream: STREAM, deadLetter: "console/orders-dlq", from: "-1", maxDeliveries: 3 }),
  });
  await page.click('nav a[data-page="consumers"]');
  await waitText("#groups-table", /billing/);
  const lagSel = 'tr[data-group="billing"] td.lag';
  const lagBefore = await textOf(lagSel);
  await appendJson({ id: 4, item: "x".repeat(3000) });
  await page.waitForFunction(({ sel, before }) => document.querySelector(sel)?.innerText !== before,
    { sel: lagSel, before: lagBefore }, { timeout: 6000 }).catch(() => fail(`group lag stayed at ${lagBefore}`));
  const lagGrown = await textOf(lagSel);
  await call("POST", "/__picomq/groups/billing/claim", {
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ consumer: "browser-test", max: 10 }),
  });
  await waitText('tr[data-group="billing"] td.inflight', /^[1-9]/, 6000);
  const lagClaimed = await textOf(lagSel);
  if (lagClaimed === lagGrown) fail(`group lag did not move after a claim: ${lagClaimed}`);
  console.log(`group lag ${lagBefore} -> ${lagGrown} (append) -> ${lagClaimed} (claim)`);
  await page.click('tr[data-group="billing"] a[href*="orders-dlq"]');
  await waitText("#stream-title", /console\/orders-dlq/);
  await page.click('nav a[data-page="consumers"]');
  await waitText("#groups-table", /billing/);
  // An Iceberg table's lag: records appended show as lag until a snapshot holds them.
  await call("PUT", "/__picomq/tables/console/orders", {
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ source: STREAM, commitInterval: "2s" }),
  });
  await waitText('tr[data-table="console.orders"] td.total', /^[1-9]/, 15000);
  await waitText('tr[data-table="console.orders"] td.lag-records', /^0$/, 15000);
  await appendJson({ id: 5, item: "for the table" });
  const recordsBefore = await textOf('tr[data-table="console.orders"] td.total');
  await page.waitForFunction(({ sel, before }) => document.querySelector(sel)?.innerText !== before,
    { sel: 'tr[data-table="console.orders"] td.total', before: recordsBefore }, { timeout: 15000 })
    .catch(() => fail(`table records stayed at ${recordsBefore}`));
  console.log(`table console.orders: ${recordsBefore} -> ${await textOf('tr[data-table="console.orders"] td.total')} records, lag shown`);
  await shot("consumers");

  // Cluster: a single node shows itself.
  await page.click('nav a[data-page="cluster"]');
  await waitText("#cluster-summary", /runs alone/);
  await shot("cluster");

  // Access: create a token from the console (its secret shown once), then revoke it.
  await page.click('nav a[data-page="access"]');
  await waitText("#tokens-table", /tok_/);
  await page.fill("#new-scopes", "read:console/**");
  await page.fill("#new-description", "made in the console");
  await page.click('#new-token-form button[type="submit"]');
  await waitText("#new-token-msg", /Created tok_/);
  const made = await page.inputValue("#new-token input");
  if (made.length < 20) fail("no secret shown for the new token");
  await waitText("#tokens-table", /made in the console/);
  const row = page.locator("#tokens-table tr", { hasText: "made in the console" });
  await row.locator("button").click();
  await page.click("#confirm-ok");
  await waitText("#tokens-msg", /Revoked/);
  const r = await fetch(`${api}/${STREAM}?offset=-1`, { headers: { authorization: `Bearer ${made}` } });
  if (r.status !== 401) fail(`a token revoked in the console still reads: ${r.status}`);
  await page.click("#new-token button");
  await shot("access");

  // Overview with the live charts.
  await page.click('nav a[data-page="overview"]');
  await page.waitForTimeout(docs ? 12000 : 4000);
  await waitText("#chart-appends-now", /[1-9]/);
  await waitText("#ov-ready", /ready/);
  await shot("overview");
  if (docs) {
    mkdirSync(docs, { recursive: true });
    const small = await browser.newContext({ viewport: { width: 1000, height: 760 }, colorScheme: "light" });
    // Signed in before the page's script runs (it reads the token once, at start).
    await small.addInitScript((t) => sessionStorage.setItem("picomq.console.token", t), adminToken);
    const p = await small.newPage();
    await p.goto(api + "/__picomq/console#/overview");
    await p.waitForTimeout(12000);
    await p.screenshot({ path: `${docs}/console-overview.png` });
    await p.goto(api + `/__picomq/console#/stream/${encodeURIComponent(STREAM)}`);
    await waitText("#tail-msg", /Following/, 8000, p);
    await appendJson({ id: 5, item: "shown in the live tail" });
    await waitText("#tail-list", /shown in the live tail/, 2000, p);
    await p.waitForTimeout(1000); // the metadata follows the tail within 250 ms
    await p.screenshot({ path: `${docs}/console-stream.png` });
    console.log(`README screenshots written to ${docs}/console-overview.png and console-stream.png`);
    await small.close();
  }
  traffic.stop();

  // Dark theme by the toggle.
  await page.click("#theme");
  const theme = await page.evaluate(() => document.documentElement.dataset.theme);
  if (theme !== "dark") fail(`the theme toggle set ${theme}`);
  await shot("overview-dark");

  // Keyboard: on a fresh load the skip link is the first stop.
  await page.reload();
  await page.keyboard.press("Tab");
  const focused = await page.evaluate(() => document.activeElement.textContent);
  if (!/Skip to content/.test(focused)) fail(`the first Tab stop is ${focused}`);

  // A token that may only read console/**: every refusal is said in words.
  await page.click('nav a[data-page="access"]');
  await page.click("#logout");
  await page.fill("#login-token", readerToken);
  await page.click("#login-submit");
  await waitText("#probe-table", /Overview \(metrics\)\s+no\s+refused: this token lacks the admin scope/);
  await waitText("#tokens-refused", /Refused/);
  await shot("access-refused");
  await page.click('nav a[data-page="overview"]');
  await waitText("#overview-msg", /Refused: this token may not do this/);
  await page.goto(api + `/__picomq/console#/stream/${encodeURIComponent(STREAM)}`);
  await waitText("#read-list", /from the console/);
  await page.fill("#append-body", '{"id": 6}');
  await page.click("#append-submit");
  await waitText("#append-msg", /Refused/);
  await page.click("#delete-stream");
  await page.fill("#confirm-input", STREAM);
  await page.click("#confirm-ok");
  await waitText("#action-msg", /Refused/);
  await call("HEAD", "/" + STREAM);
  await shot("stream-refused");
  console.log("the read-only token: metrics, tokens, append and delete refused in words; reads allowed");

  // Phone width: nothing wider than the screen.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(300);
  await shot("stream-phone");
  for (const hash of [`#/stream/${encodeURIComponent(STREAM)}`, "#/overview", "#/streams", "#/consumers", "#/cluster", "#/access"]) {
    await page.goto(api + "/__picomq/console" + hash);
    await page.waitForTimeout(400);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    if (overflow > 1) fail(`${hash} is ${overflow} px wider than a phone screen`);
  }

  // The admin port serves the console too (its overview; the rest says where to go).
  const adminPage = await context.newPage();
  const res = await adminPage.goto(adminUrl + "/__picomq/console#/overview");
  if (res.status() !== 200 || !(res.headers()["content-security-policy"] || "").includes("'self'")) {
    fail(`the admin port's console: ${res.status()}`);
  }
  await adminPage.evaluate((t) => sessionStorage.setItem("picomq.console.token", t), adminToken);
  await adminPage.reload();
  await waitText("#ov-ready", /ready/, 8000, adminPage);
  await adminPage.goto(adminUrl + "/__picomq/console#/streams");
  await waitText("#streams-msg", /does not serve/, 8000, adminPage);
  await shot("admin-port", adminPage);
  console.log("the admin port serves the console; its streams page says to use the API port");

  for (const secret of [adminToken, readerToken, made]) {
    const leaked = urls.find((u) => u.includes(secret));
    if (leaked) fail(`a token appears in a requested URL: ${leaked.replace(secret, "<token>")}`);
  }
  if (pageErrors.length) fail(`errors in the page: ${pageErrors.join(" | ")}`);
  console.log(`console test passed in ${((Date.now() - started) / 1000).toFixed(1)} s (live tail ${tailMs} ms); screenshots in ${shots}`);
} finally {
  if (traffic) traffic.stop();
  await browser.close();
}
