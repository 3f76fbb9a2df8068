-- wrk script for benchmarks/cold-read.sh: thread N (one connection each, so run
-- wrk with -t S -c S) appends to stream PREFIX..N, one JSON record per POST, one
-- request at a time. Record i of stream s is exactly BYTES bytes:
--   {"s":s,"i":i,"pad":"ccc...c"}   with c = letter (s + i) mod 26
-- so a reader can check every record (cold-read.py computes the same text). i is
-- the number of 2xx answers so far: a failed append is sent again with the same i,
-- and the call wrk makes on thread 0 to check the script sends nothing and uses no i.
--   wrk -t16 -c16 -d15s -s cold-read.lua http://127.0.0.1:PORT -- /v1/stream/cold- 100
-- At the end it writes one line per stream to $COLD_READ_COUNTS:
--   stream <TAB> request() calls <TAB> 2xx answers <TAB> other answers
local threads = {}
local next_stream = 0

function setup(thread)
  thread:set("stream", next_stream)
  next_stream = next_stream + 1
  table.insert(threads, thread)
end

function init(args)
  path = args[1] .. stream
  bytes = tonumber(args[2] or "100")
  sent, ok, bad = 0, 0, 0
end

function request()
  local head = string.format('{"s":%d,"i":%d,"pad":"', stream, ok)
  local c = string.char(97 + (stream + ok) % 26)
  local body = head .. string.rep(c, bytes - #head - 2) .. '"}'
  sent = sent + 1
  return wrk.format("POST", path, { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok = ok + 1
  else
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local out = assert(io.open(os.getenv("COLD_READ_COUNTS"), "w"))
  for _, t in ipairs(threads) do
    out:write(string.format("%d\t%d\t%d\t%d\n", t:get("stream"), t:get("sent"), t:get("ok"), t:get("bad")))
  end
  out:close()
end
