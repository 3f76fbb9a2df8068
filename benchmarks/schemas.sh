#!/usr/bin/env bash
# Schema validation on append: appends/s of 1 KiB JSON documents into streams bound
# to a 20-field JSON Schema (every message checked) against the same load into
# streams bound to nothing, on one PicoMQ server on its defaults (local directory
# store, SQLite index), everything on loopback.
# - the schema (schema-20-fields.json: 5 strings, 5 integers, 5 numbers, 5 arrays of
#   strings; all required, no other properties) is registered once as a JSON subject;
# - the load: 16 writers on 16 streams, each message the 1,008-byte document
#   schema-20-fields-doc.json (valid against the schema), as JSON arrays of 10
#   messages per request and as single-message requests, 10 s each (2 s warm-up);
# - ROUNDS rounds, validated and unvalidated interleaved (the order alternating), so
#   what the machine does meanwhile hits both; fresh streams for every run. Identical
#   runs on a 2-core machine differ by 10-25%, hence 5 rounds;
# - per run: messages/s, request p50/p99, server CPU; per batch size: the mean of the
#   rounds' ratios validated/unvalidated (the target is 0.8 or more);
# - at the end, checks that the bound streams validate (an invalid message answers
#   400, the load's document 204) and that the unbound ones do not (the invalid
#   message answers 204), so the figure cannot measure nothing.
# About 5 minutes on 2 cores, and about 7 GB of disk per round (the server keeps
# what it was sent; nothing is old enough for compaction or GC before the end).
# Output: results/schemas.txt
#
#   benchmarks/schemas.sh      (ROUNDS=5 BATCHES=10,1 WRITERS=16 DURATION=10s WARMUP=2s)
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
BATCHES=${BATCHES:-10,1}
WRITERS=${WRITERS:-16}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
SUBJECT=bench-20-fields
SCHEMA_FILE="$BENCH_DIR/schema-20-fields.json"
DOC_FILE="$BENCH_DIR/schema-20-fields-doc.json"
OUT="$RESULTS/schemas.txt"

free_gb=$(df --output=avail -B1G "$WORK" | tail -1 | tr -d ' ')
if [ "$free_gb" -lt $((7 * ROUNDS + 4)) ]; then
  echo "$WORK has ${free_gb} GB free; $ROUNDS rounds write about $((7 * ROUNDS)) GB" \
    "(set ROUNDS lower, or BENCH_WORK to a larger disk)" >&2
  exit 1
fi
build_picomq
port=$(free_port)
start_picomq "$port"
origin="http://127.0.0.1:$port"

# create_streams PREFIX bound|unbound: WRITERS JSON streams PREFIX-0.., bound to
# SUBJECT or not. The bench's own create of each then answers 200 and leaves the
# binding as it is.
create_streams() {
  local prefix=$1 mode=$2 i code
  local bind=()
  [ "$mode" = bound ] && bind=(-H "Stream-Schema-Subject: $SUBJECT")
  for ((i = 0; i < WRITERS; i++)); do
    code=$(curl -s -o "$WORK/create.out" -w '%{http_code}' -X PUT "$origin/v1/stream/$prefix-$i" \
      -H 'Content-Type: application/json' "${bind[@]}")
    if [ "$code" != 201 ]; then
      echo "creating $prefix-$i answered $code: $(cat "$WORK/create.out")" >&2
      exit 1
    fi
  done
}

# post STREAM FILE: the status of appending FILE's JSON to STREAM.
post() {
  curl -s -o "$WORK/post.out" -w '%{http_code}' -X POST "$origin/v1/stream/$1" \
    -H 'Content-Type: application/json' --data-binary "@$2"
}

{
  echo "# schema validation on append: picomq $(git -C "$REPO" rev-parse --short HEAD)"
  machine_note
  echo "work:    $WRITERS writers on $WRITERS streams, $(($(wc -c <"$DOC_FILE") - 1))-byte documents" \
    "($(basename "$DOC_FILE")), batches of ${BATCHES//,/ and } per request, $DURATION each" \
    "($WARMUP warm-up), $ROUNDS rounds interleaved"

  registered=$(jq -n --rawfile s "$SCHEMA_FILE" '{schemaType: "JSON", schema: $s}' |
    curl -s -X POST "$origin/__picomq/schemas/subjects/$SUBJECT/versions" \
      -H 'Content-Type: application/vnd.schemaregistry.v1+json' --data-binary @-)
  if ! jq -e '.id and .version' <<<"$registered" >/dev/null 2>&1; then
    echo "registering $SUBJECT failed: $registered" >&2
    exit 1
  fi
  echo "schema:  $(basename "$SCHEMA_FILE") registered as $SUBJECT" \
    "(id $(jq .id <<<"$registered"), version $(jq .version <<<"$registered"))"
  echo

  : >"$WORK/runs"
  IFS=, read -r -a batches <<<"$BATCHES"
  for ((r = 1; r <= ROUNDS; r++)); do
    for ((b = 0; b < ${#batches[@]}; b++)); do
      batch=${batches[$b]}
      if (((r + b) % 2)); then order="unbound bound"; else order="bound unbound"; fi
      for mode in $order; do
        prefix="$mode-r$r-b$batch"
        log "round $r, $batch per request, $mode streams"
        create_streams "$prefix" "$mode"
        bench "$WORK/$prefix.json" "$port" "$prefix" --stream-prefix "$prefix" \
          --streams "$WRITERS" --in-flight "$WRITERS" --batch "$batch" \
          --duration "$DURATION" --warmup "$WARMUP" --message-file "$DOC_FILE" --quiet
        printf '%s\t%s\t%s\t%s\n' "$r" "$batch" "$mode" "$WORK/$prefix.json" >>"$WORK/runs"
        # Let the server pack what the run wrote before the next one starts.
        sleep 2
      done
    done
  done

  failed=0
  python3 - "$WORK/runs" <<'EOF' || failed=1
import json, sys
from collections import defaultdict

rows, by = [], defaultdict(dict)
for line in open(sys.argv[1]):
    r, batch, mode, path = line.rstrip("\n").split("\t")
    rep = json.load(open(path))
    a, s = rep["append"], rep["server"]
    row = dict(round=int(r), batch=int(batch), mode=mode, msgs=a["records_per_s"],
               mib=a["mib_per_s"], p50=a["ack_latency_ms"]["p50"], p99=a["ack_latency_ms"]["p99"],
               cpu=s.get("cpu_s"), cpu_m=s.get("cpu_s_per_million_records"),
               client=rep["client"].get("cpu_cores_busy"), errors=a["errors"],
               idle=rep["machine"].get("cpu_idle_share"),
               secs=rep["workload"]["duration_s"])
    rows.append(row)
    by[(row["batch"], row["round"])][mode] = row

def f(v, fmt):
    return "-" if v is None else format(v, fmt)

table = [["round", "msgs/request", "streams", "msgs/s", "MiB/s", "p50 ms", "p99 ms",
          "server cores", "server CPU s/1M msgs", "client cores", "machine idle", "errors"]]
for x in rows:
    cores = None if x["cpu"] is None else x["cpu"] / x["secs"]
    table.append([str(x["round"]), str(x["batch"]),
                  "bound (validated)" if x["mode"] == "bound" else "unbound",
                  f(x["msgs"], ",.0f"), f(x["mib"], ".1f"), f(x["p50"], ".3f"), f(x["p99"], ".3f"),
                  f(cores, ".2f"), f(x["cpu_m"], ".1f"), f(x["client"], ".2f"),
                  "-" if x["idle"] is None else f"{x['idle']:.0%}", str(x["errors"])])

def md(t):
    w = [max(len(r[i]) for r in t) for i in range(len(t[0]))]
    out = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in t]
    out.insert(1, "| " + " | ".join("-" * n for n in w) + " |")
    return "\n".join(out)

print(md(table))
print()
summary = [["msgs/request", "validated msgs/s (mean)", "unvalidated msgs/s (mean)",
            "ratio per round", "mean ratio", "p50 ms v/u", "p99 ms v/u", "CPU per msg v/u"]]
bad = any(x["errors"] or not x["msgs"] for x in rows)
for batch in sorted({x["batch"] for x in rows}, reverse=True):
    pairs = [by[(batch, r)] for r in sorted({x["round"] for x in rows}) if len(by[(batch, r)]) == 2]
    if not pairs:
        continue
    mean = lambda k, m: sum(p[m][k] for p in pairs) / len(pairs)
    ratios = [p["bound"]["msgs"] / p["unbound"]["msgs"] for p in pairs]
    cpu = (f(mean("cpu_m", "bound") / mean("cpu_m", "unbound"), ".2f")
           if all(p[m]["cpu_m"] for p in pairs for m in p) else "-")
    summary.append([str(batch), f(mean("msgs", "bound"), ",.0f"), f(mean("msgs", "unbound"), ",.0f"),
                    " ".join(format(x, ".3f") for x in ratios), format(sum(ratios) / len(ratios), ".3f"),
                    f"{mean('p50', 'bound'):.3f} / {mean('p50', 'unbound'):.3f}",
                    f"{mean('p99', 'bound'):.3f} / {mean('p99', 'unbound'):.3f}", cpu])
print(md(summary))
print()
print("ratio: validated msgs/s over unvalidated msgs/s of the same round (target >= 0.8);")
print("p50/p99: request (append) acknowledgement latency; CPU: server CPU seconds per message.")
if bad:
    print("WARNING: a run had errors or appended nothing; its figures are not comparable")
    sys.exit(1)
EOF

  # The figures above mean something only if the bound streams really validated.
  echo
  last=$(awk -F'\t' '$3 == "bound" { p = $4 } END { print p }' "$WORK/runs")
  bound=$(basename "$last" .json)-0
  unbound=$(awk -F'\t' '$3 == "unbound" { p = $4 } END { print p }' "$WORK/runs")
  unbound=$(basename "$unbound" .json)-0
  jq -c 'del(.field_01) + {extra: true}' "$DOC_FILE" >"$WORK/invalid.json"
  check() { # WHAT WANT GOT
    if [ "$2" = "$3" ]; then echo "verify:  $1: $3 (ok)"; else echo "verify:  $1: $3, expected $2 (FAILED)"; failed=1; fi
  }
  subject=$(curl -s -I "$origin/v1/stream/$bound" | tr -d '\r' |
    awk -F': ' 'tolower($1) == "stream-schema-subject" { print $2 }')
  check "$bound bound to" "$SUBJECT" "${subject:-nothing}"
  check "invalid message (field_01 missing, one extra) into $bound" 400 "$(post "$bound" "$WORK/invalid.json")"
  echo "         $(jq -c '.error | {code, rule, path, message}' "$WORK/post.out" 2>/dev/null || cat "$WORK/post.out")"
  check "the load's document into $bound" 204 "$(post "$bound" "$DOC_FILE")"
  check "invalid message into unbound $unbound" 204 "$(post "$unbound" "$WORK/invalid.json")"
  echo "server RSS at end: $(awk '/VmRSS/ {printf "%.0f MiB", $2/1024}' "/proc/$SERVER_PID/status"), data dir $(du -sh "$WORK/picomq-$port" | cut -f1)"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit "$failed"
} | tee "$OUT"
