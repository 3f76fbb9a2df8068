// The web console's cost to a loaded server, in a real headless Chromium: with the
// server under a steady append load, alternate windows with no console open and
// windows with one console page open (its default 1 s refresh), and compare the
// server process's CPU time (utime + stime from /proc/PID/stat) over each window.
// Also counts the requests the page made per second.
//
// Usage: node console-overhead.mjs API_URL SERVER_PID PAGE ROUNDS WINDOW_SECONDS
//   PAGE: overview | streams | stream/NAME | consumers
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";

const [api, pid, pageName, roundsArg, windowArg] = process.argv.slice(2);
const rounds = Number(roundsArg);
const windowMs = Number(windowArg) * 1000;
const TICK = 100; // USER_HZ on Linux

function cpuSeconds() {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / TICK; // utime, stime
}

// The server's appends so far (picomq_appends_total), to see the load each window got:
// on 2 cores the browser competes with the load generator, and fewer appends cost
// the server less whatever the console does.
async function appends() {
  const text = await (await fetch(api + "/metrics")).text();
  let n = 0;
  for (const line of text.split("\n")) {
    if (/^picomq_appends_total[ {]/.test(line)) n += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return n;
}

// [server CPU in cores, appends/s] over a window of `ms`.
async function measure(ms) {
  const a0 = await appends();
  const c0 = cpuSeconds();
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, ms));
  const c1 = cpuSeconds();
  const secs = (performance.now() - t0) / 1000;
  return [(c1 - c0) / secs, ((await appends()) - a0) / secs];
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const url = api + "/__picomq/console#/" +
  (pageName.startsWith("stream/") ? "stream/" + encodeURIComponent(pageName.slice(7)) : pageName);
const off = [];
const on = [];
const rps = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  for (let i = 0; i < rounds; i++) {
    off.push(await measure(windowMs));
    const page = await context.newPage();
    let requests = 0;
    page.on("request", () => requests++);
    await page.goto(url);
    await page.waitForTimeout(2000); // past the first load's requests
    requests = 0;
    const t0 = performance.now();
    on.push(await measure(windowMs));
    rps.push(requests / ((performance.now() - t0) / 1000));
    await page.close();
    console.log(`round ${i + 1}: server CPU without the console ${(off[i][0] * 100).toFixed(2)}% at ${off[i][1].toFixed(0)} appends/s, ` +
      `with ${pageName} open ${(on[i][0] * 100).toFixed(2)}% at ${on[i][1].toFixed(0)} appends/s (${rps[i].toFixed(1)} console requests/s)`);
  }
} finally {
  await browser.close();
}
const mean = (a) => a.reduce((x, y) => x + y, 0) / a.length;
const pct = (v) => (v * 100).toFixed(2);
const diffs = on.map((v, i) => v[0] - off[i][0]);
const sd = Math.sqrt(diffs.reduce((s, d) => s + (d - mean(diffs)) ** 2, 0) / Math.max(diffs.length - 1, 1));
console.log(`${pageName}: without ${pct(mean(off.map((v) => v[0])))}% of one core at ${mean(off.map((v) => v[1])).toFixed(0)} appends/s, ` +
  `with ${pct(mean(on.map((v) => v[0])))}% at ${mean(on.map((v) => v[1])).toFixed(0)} appends/s; ` +
  `difference ${pct(mean(diffs))} ± ${pct(sd / Math.sqrt(diffs.length))} points (mean ± standard error, ${rounds} rounds of ${windowArg} s); ` +
  `${mean(rps).toFixed(1)} console requests/s`);
