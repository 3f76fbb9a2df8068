// A real browser (Debian's headless Chromium, driven by playwright-core) against a
// running PicoMQ with auth on: a page on a listed origin appends with a bearer token
// (the browser sends a CORS preflight first) and follows the stream over EventSource
// with a signed read token in the query string; a page on an unlisted origin is
// refused by the preflight, so its append never reaches the stream.
//
// Usage: node cors_sse.mjs API_URL GOOD_PAGE_URL EVIL_PAGE_URL WRITE_TOKEN READ_TOKEN
import { chromium } from "playwright-core";

const [api, goodPage, evilPage, writeToken, readToken] = process.argv.slice(2);
const fail = (msg) => {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
try {
  const page = await browser.newPage();
  await page.goto(goodPage);
  // Follow the stream live, then append from the page: the event must arrive.
  const got = await page.evaluate(
    async ({ api, writeToken, readToken }) => {
      const events = [];
      const es = new EventSource(`${api}/chat/1?offset=-1&live=sse&token=${readToken}`);
      const seen = new Promise((resolve, reject) => {
        es.addEventListener("data", (e) => {
          events.push(e.data);
          if (e.data.includes("from the page")) resolve();
        });
        es.onerror = () => {};
        setTimeout(() => reject(new Error(`timeout; events: ${JSON.stringify(events)}`)), 10000);
      });
      await new Promise((r) => setTimeout(r, 300));
      const r = await fetch(`${api}/chat/1`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${writeToken}`,
          "content-type": "text/plain",
          "producer-id": "browser",
          "producer-epoch": "0",
          "producer-seq": "0",
        },
        body: " from the page",
      });
      const status = r.status;
      const next = r.headers.get("stream-next-offset");
      await seen;
      es.close();
      return { status, next, events };
    },
    { api, writeToken, readToken },
  );
  if (got.status !== 200 && got.status !== 204) fail(`append from the listed origin: ${got.status}`);
  if (!got.next) fail("Stream-Next-Offset is not exposed to the page");
  if (!got.events.join("").includes("hello")) fail(`history missing: ${JSON.stringify(got.events)}`);
  console.log(`listed origin: append ${got.status}, next offset visible, SSE events ${JSON.stringify(got.events)}`);

  // The same from an unlisted origin: the preflight is refused, fetch rejects.
  const evil = await browser.newPage();
  await evil.goto(evilPage);
  const refused = await evil.evaluate(
    async ({ api, writeToken }) => {
      try {
        await fetch(`${api}/chat/1`, {
          method: "POST",
          headers: { authorization: `Bearer ${writeToken}`, "content-type": "text/plain" },
          body: " from evil",
        });
        return "sent";
      } catch (e) {
        return `refused: ${e.name}`;
      }
    },
    { api, writeToken },
  );
  if (!refused.startsWith("refused")) fail(`unlisted origin could append (${refused})`);
  console.log(`unlisted origin: ${refused}`);
} finally {
  await browser.close();
}
