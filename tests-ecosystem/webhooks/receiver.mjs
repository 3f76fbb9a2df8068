// A webhook receiver for PicoMQ's subscription tests, on Node's own crypto (an
// Ed25519 implementation independent of the server's): every delivery's
// Webhook-Signature is verified against the server's JWKS, a copy of the body with
// one byte changed must fail verification, and the timestamp must be within five
// minutes. Each delivery is logged as one JSON line.
//
//   node receiver.mjs --jwks URL --log FILE --port-file FILE [--fail-first N]
//
// The first N deliveries are answered 503 (to drive the server's retries); later
// ones {"done": true}.
import { createServer } from "node:http"
import { createPublicKey, verify } from "node:crypto"
import { appendFileSync, writeFileSync } from "node:fs"

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => {
    if (a.startsWith("--")) pairs.push([a.slice(2), all[i + 1]])
    return pairs
  }, [])
)
const failFirst = Number(args["fail-first"] ?? 0)
let jwks = null
let deliveries = 0

async function keyFor(kid) {
  if (!jwks || !jwks.keys.some((k) => k.kid === kid)) {
    const res = await fetch(args.jwks)
    jwks = await res.json()
  }
  const jwk = jwks.keys.find((k) => k.kid === kid)
  if (!jwk) return null
  return createPublicKey({ key: { kty: jwk.kty, crv: jwk.crv, x: jwk.x }, format: "jwk" })
}

function parseSignature(header) {
  const parts = Object.fromEntries(
    (header ?? "").split(",").map((p) => {
      const i = p.indexOf("=")
      return [p.slice(0, i), p.slice(i + 1)]
    })
  )
  return { t: parts.t, kid: parts.kid, sig: parts.ed25519 }
}

const server = createServer((req, res) => {
  const chunks = []
  req.on("data", (c) => chunks.push(c))
  req.on("end", async () => {
    const raw = Buffer.concat(chunks)
    const { t, kid, sig } = parseSignature(req.headers["webhook-signature"])
    let valid = false
    let tamperRejected = false
    try {
      const key = await keyFor(kid)
      const signature = Buffer.from(sig, "base64url")
      const signed = Buffer.concat([Buffer.from(`${t}.`), raw])
      valid = key !== null && verify(null, signed, key, signature)
      const tampered = Buffer.from(signed)
      tampered[tampered.length - 2] ^= 1
      tamperRejected = key !== null && !verify(null, tampered, key, signature)
    } catch (e) {
      valid = false
    }
    const fresh = Math.abs(Date.now() / 1000 - Number(t)) < 300
    deliveries += 1
    const fail = deliveries <= failFirst
    let body = null
    try {
      body = JSON.parse(raw.toString("utf8"))
    } catch {}
    appendFileSync(
      args.log,
      JSON.stringify({ at_ms: Date.now(), n: deliveries, kid, valid, tamperRejected, fresh, failed: fail, body }) + "\n"
    )
    if (fail) {
      res.writeHead(503, { "content-type": "application/json" })
      res.end('{"error":"not yet"}')
    } else {
      res.writeHead(200, { "content-type": "application/json" })
      res.end('{"done":true}')
    }
  })
})

server.listen(0, "127.0.0.1", () => {
  writeFileSync(args["port-file"], String(server.address().port))
})
