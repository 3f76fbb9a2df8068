// Starts the Durable Streams reference server (@durable-streams/server, installed
// from npm at run time by lib.sh) with its file-backed store, on loopback only.
//   PORT=4438 DATA_DIR=/tmp/x node peer-server.mjs
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number.parseInt(process.env.PORT ?? "4438", 10)
const dataDir = process.env.DATA_DIR
if (!dataDir) throw new Error("DATA_DIR is required (the file-backed store)")
const server = new DurableStreamTestServer({
  port,
  host: "127.0.0.1",
  dataDir,
  longPollTimeout: 25_000,
  compression: false,
})
const url = await server.start()
console.log(`peer serving ${url} with file store ${dataDir}`)
const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
