// Ecosystem test: the Yjs provider of @durable-streams/y-durable-streams 0.2.7 against
// a Durable Streams server.   node late_joiner.mjs http://127.0.0.1:PORT
//
// The package has two halves and both run here: YjsServer (its server side, started
// in this process, proxying to the server under test) and YjsProvider (the client).
// YjsServer compacts a document into a snapshot keyed by the .updates stream's tail
// offset E, and then computes the next offset itself as "{hi}_{lo+1}" of E:
//   - the snapshot answer carries Stream-Next-Offset = E+1, and a provider that loads
//     the snapshot reads .updates from E+1 (a catch-up GET; its live reads, SSE or
//     long-poll, then use whatever Stream-Next-Offset that GET answered);
//   - the next compaction reads .updates from E+1 too.
// E+1 is one past the tail until something is appended after the snapshot, and lies
// inside the first append after it from then on. The server must answer both as the
// reference server does (200, empty, up-to-date, Stream-Next-Offset = the tail; the
// whole append that contains the offset), or late joiners and compaction fail.
//
// Steps: a baseline on a fresh document (two peers, no snapshot, so no computed
// offset); then, on another document, a writer edits, compaction makes a snapshot at
// the tail, joiner B arrives (reads from tail+1), the writer appends, joiner C arrives
// in long-poll mode (reads from inside that append), a second compaction runs (reads
// from inside that append), joiner D loads the newest snapshot, then every joiner
// must follow a live edit and see the others' awareness states. A failed check does not stop the run: checks
// that depend on it are skipped, so one run shows every failure. Exit 1 on any
// failure. Needs only Node 20's built-ins (fetch, web streams): no browser API is
// polyfilled. YJS_VERBOSE=1 prints every request.
import * as Y from "yjs"
import { Awareness } from "y-protocols/awareness"

const dsUrl = (process.argv[2] ?? "").replace(/\/$/, "")
if (!/^https?:\/\//.test(dsUrl)) {
  console.error("usage: node late_joiner.mjs http://HOST:PORT (a Durable Streams server)")
  process.exit(2)
}
const STEP_MS = Number(process.env.YJS_STEP_TIMEOUT_MS ?? 8000)
const HARD_LIMIT_MS = 55_000
const verbose = process.env.YJS_VERBOSE === "1"

// Every request of both halves goes through global fetch: keep the recent ones (with
// their answers) to show what happened when a check fails.
const recent = []
let requestNo = 0
const realFetch = globalThis.fetch
globalThis.fetch = async (input, init = {}) => {
  const url = typeof input === "string" ? input : input.url
  const entry = { no: requestNo++, method: init.method ?? "GET", url: url.replace(dsUrl, "<server>") }
  recent.push(entry)
  if (recent.length > 200) recent.shift()
  try {
    const res = await realFetch(input, init)
    entry.status = res.status
    entry.next = res.headers.get("stream-next-offset") ?? undefined
    if (res.headers.has("stream-up-to-date")) entry.upToDate = true
    if (res.status >= 400) {
      entry.body = (await res.clone().text().catch(() => "")).slice(0, 200)
    }
    if (verbose) console.log("   ", fmt(entry))
    return res
  } catch (err) {
    entry.error = String(err?.message ?? err)
    throw err
  }
}
const fmt = (e) =>
  `${e.method} ${e.url} -> ${e.status ?? e.error ?? "(pending)"}` +
  (e.next ? ` next=${e.next}` : "") +
  (e.upToDate ? " up-to-date" : "") +
  (e.body ? ` body=${JSON.stringify(e.body)}` : "")
// Reads of .updates at an offset (not -1/now): the ones the checks are about.
const offsetReads = (since) =>
  recent
    .filter((e) => e.no >= since && e.url.startsWith("<server>") && /\.updates\?offset=\d/.test(e.url))

const { YjsProvider } = await import("@durable-streams/y-durable-streams")
const { YjsServer } = await import("@durable-streams/y-durable-streams/server")

const counts = { passed: 0, failed: 0, skipped: 0 }
const cleanups = []
async function finish() {
  for (const c of cleanups.reverse()) {
    try {
      await Promise.race([c(), sleep(1000)])
    } catch {}
  }
  const failed = counts.failed > 0
  console.log(
    failed
      ? `yjs late-joiner test FAILED against ${dsUrl}`
      : `yjs late-joiner test passed against ${dsUrl}`,
  )
  console.log(`${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped`)
  process.exit(failed ? 1 : 0)
}
setTimeout(() => {
  console.error(`FAIL: the whole test was not done after ${HARD_LIMIT_MS / 1000} s`)
  counts.failed += 1
  finish()
}, HARD_LIMIT_MS).unref()

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
let n = 0
// Runs one check: body() returns nothing on success or throws an Error saying why.
async function check(name, body, { needs = [] } = {}) {
  n += 1
  const broken = needs.filter((p) => p.broken)
  if (broken.length) {
    counts.skipped += 1
    console.log(`skip ${n} - ${name} (${broken.map((p) => p.name).join(", ")} failed earlier)`)
    return false
  }
  const since = requestNo
  try {
    const note = await body()
    counts.passed += 1
    console.log(`ok ${n} - ${name}${typeof note === "string" ? ` (${note})` : ""}`)
    return true
  } catch (err) {
    counts.failed += 1
    console.log(`not ok ${n} - ${name}`)
    console.error(`FAIL: ${name}: ${err.message}`)
    const reads = offsetReads(since)
    if (reads.length) {
      console.error("  reads of .updates at an offset during this check:")
      for (const e of reads.slice(0, 12)) console.error("    " + fmt(e))
    }
    return false
  }
}
async function waitFor(cond, why) {
  const deadline = Date.now() + STEP_MS
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) throw new Error(typeof why === "function" ? why() : why)
    await sleep(50)
  }
}

// ---- setup ----
const service = "ecosystem"
const docId = `late-joiner-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`
const updatesUrl = `${dsUrl}/v1/stream/yjs/${service}/docs/${docId}/.updates`
const yjsServer = new YjsServer({
  dsServerUrl: dsUrl,
  port: 0,
  host: "127.0.0.1",
  compactionThreshold: 4096,
})
const baseUrl = `${await yjsServer.start()}/v1/yjs/${service}`
cleanups.push(() => yjsServer.stop())
console.log(`# server under test ${dsUrl}; YjsServer ${baseUrl}; document ${docId}`)

function peer(name, liveMode, doc_ = docId) {
  const doc = new Y.Doc()
  const awareness = new Awareness(doc)
  awareness.setLocalStateField("user", name)
  const errors = []
  const provider = new YjsProvider({ doc, awareness, baseUrl, docId: doc_, liveMode })
  provider.on("error", (err) => errors.push(String(err?.message ?? err)))
  const p = { name, doc, awareness, provider, errors, text: doc.getText("t"), broken: false }
  cleanups.push(() => provider.destroy())
  return p
}
const reported = (p) => {
  if (p.errors.length) throw new Error(`${p.name} reported: ${p.errors[0]}`)
}
async function joined(p) {
  try {
    await waitFor(
      () => (reported(p), p.provider.synced && p.provider.connected),
      () => `${p.name} not synced after ${STEP_MS} ms (connected=${p.provider.connected})`,
    )
  } catch (err) {
    p.broken = true
    throw err
  }
}
const vector = (p) => [...Y.decodeStateVector(Y.encodeStateVector(p.doc))].sort((a, b) => a[0] - b[0])
const sameState = (a, b) =>
  a.text.toString() === b.text.toString() && JSON.stringify(vector(a)) === JSON.stringify(vector(b))
async function converged(p, ref = writer) {
  try {
    await waitFor(
      () => (reported(p), reported(ref), sameState(ref, p)),
      () =>
        `${p.name} differs from ${ref.name} after ${STEP_MS} ms: ` +
        `${p.text.length} vs ${ref.text.length} characters, ` +
        `state vector ${JSON.stringify(vector(p))} vs ${JSON.stringify(vector(ref))}`,
    )
  } catch (err) {
    p.broken = true
    throw err
  }
}
async function edit(text, at, who = writer) {
  who.doc.transact(() => who.text.insert(at ?? who.text.length, text))
  await who.provider.flush()
}
const sees = (p, q, cursor) => p.awareness.getStates().get(q.doc.clientID)?.cursor === cursor
async function tail() {
  const res = await realFetch(updatesUrl, { method: "HEAD" })
  return res.headers.get("stream-next-offset")
}
async function snapshotOffset() {
  const res = await realFetch(`${baseUrl}/docs/${docId}?offset=snapshot`, { redirect: "manual" })
  await res.arrayBuffer()
  const off = new URL(res.headers.get("location") ?? "", baseUrl).searchParams.get("offset") ?? ""
  return off.endsWith("_snapshot") ? off.slice(0, -"_snapshot".length) : null
}
// What YjsServer computes from a snapshot offset (its incrementOffset).
const plusOne = (o) => {
  const [hi, lo] = o.split("_")
  return `${hi}_${String(Number(lo) + 1).padStart(lo.length, "0")}`
}
const big = (tag) => `${tag}:` + "x".repeat(5000) + "\n"
const snapshotAtTail = async (notOld) => {
  const [s, t] = [await snapshotOffset(), await tail()]
  return s && s !== notOld && s === t ? s : null
}

// ---- 0. baseline, no computed offsets: two peers on a fresh document ----
// (reads from -1, then from offsets the server answered; awareness from offset=now)
{
  const fresh = `${docId}-fresh`
  const p1 = peer("fresh-1", "sse", fresh)
  await check("baseline: a peer connects to a fresh document and edits", async () => {
    await joined(p1)
    await edit("hello from fresh-1\n", undefined, p1)
  })
  const p2 = peer("fresh-2", "long-poll", fresh)
  await check("baseline: a second peer (long-poll) joins from the start and converges", async () => {
    await joined(p2)
    await converged(p2, p1)
  }, { needs: [p1] })
  await check("baseline: edits and awareness flow both ways", async () => {
    await edit("hello from fresh-2\n", 0, p2)
    await converged(p1, p2)
    p1.awareness.setLocalStateField("cursor", 1)
    p2.awareness.setLocalStateField("cursor", 2)
    await waitFor(() => sees(p1, p2, 2) && sees(p2, p1, 1), "awareness states did not reach the other peer")
  }, { needs: [p1, p2] })
}

// ---- 1. writer ----
const writer = peer("writer", "sse")
const writerOk = await check("writer connects and writes 5 small updates", async () => {
  await joined(writer)
  for (let i = 0; i < 5; i++) await edit(`line ${i}\n`)
  reported(writer)
  return `tail ${await tail()}`
})
if (!writerOk) await finish()

// ---- 2. first compaction: a snapshot exactly at the tail ----
let e1 = null
await check("first compaction makes a snapshot at the tail", async () => {
  await edit(big("first"))
  e1 = await waitFor(
    () => snapshotAtTail(null),
    "no snapshot at the tail of .updates: YjsServer's compaction failed (see its log above)",
  )
  return `E1=${e1}`
})
if (!e1) await finish()

// ---- 3. late joiner B: loads the snapshot, reads .updates from E1+1 = one past the tail ----
const b = peer("joiner-B", "sse")
await check(`joiner B (sse) loads the snapshot and catches up from one past the tail, ${plusOne(e1)}`, async () => {
  await joined(b)
  await converged(b)
})

// ---- 4. appends after the snapshot: E1+1 now lies inside the first of them ----
for (let i = 0; i < 3; i++) await edit(`after snapshot ${i}\n`, 0)
const tail1 = await tail()
await check(`joiner B follows live edits after starting at tail+1 (tail now ${tail1})`, () => converged(b), {
  needs: [b],
})

const c = peer("joiner-C", "long-poll")
await check(`joiner C (long-poll) catches up from inside the first append after the snapshot, ${plusOne(e1)}`, async () => {
  await joined(c)
  await converged(c)
})

// ---- 5. second compaction: YjsServer reads .updates from E1+1 itself ----
await edit(big("second"))
await check(`second compaction reads .updates from inside an append (${plusOne(e1)}) and makes a snapshot at the tail`, async () => {
  const e2 = await waitFor(
    () => snapshotAtTail(e1),
    () =>
      `no new snapshot at the tail (the snapshot is still ${e1}): ` +
      `the compaction's read from ${plusOne(e1)} failed or gave wrong data (see YjsServer's log above)`,
  )
  return `E2=${e2}`
})

const dFrom = plusOne((await snapshotOffset()) ?? e1)
const d = peer("joiner-D", "sse")
await check(`joiner D (sse) loads the newest snapshot and catches up from ${dFrom}`, async () => {
  await joined(d)
  await converged(d)
})

// ---- 6. everyone follows a live edit; awareness reaches everyone ----
await edit("final edit\n", 0)
for (const p of [b, c, d]) {
  await check(`${p.name} (${p.provider.liveMode ?? ""}) follows a live edit`, () => converged(p), { needs: [p] })
}

writer.awareness.setLocalStateField("cursor", 42)
d.awareness.setLocalStateField("cursor", 7)
for (const p of [b, c, d]) {
  await check(`${p.name} sees the writer's awareness state`, () =>
    waitFor(() => sees(p, writer, 42), `${p.name} never saw the writer's awareness state`),
    { needs: [p] },
  )
}
await check("the writer sees joiner D's awareness state", () =>
  waitFor(() => sees(writer, d, 7), "the writer never saw joiner D's awareness state"),
  { needs: [d] },
)

await finish()
