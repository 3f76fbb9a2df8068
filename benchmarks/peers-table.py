#!/usr/bin/env python3
"""The PicoMQ vs Electric table of benchmarks/peers.sh: reads the reports it wrote
in DIR (SCENARIO-SERVER-ROUND.json: `picomq bench` JSON, or benchmarks/bytes.py
JSON for the bytes scenario) and prints one Markdown table, one column per server
and round, then the ratio Electric/PicoMQ per round. Also writes DIR/summary.json.

  python3 benchmarks/peers-table.py DIR ROUNDS
"""
import json
import os
import sys

SERVERS = [("picomq", "PicoMQ"), ("electric", "Electric")]


def load(d, scenario, server, rnd):
    p = os.path.join(d, f"{scenario}-{server}-{rnd}.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def bench(key):
    def get(r):
        a, s = r["append"], r.get("server") or {}
        return {
            "records/s": a["records_per_s"],
            "appends/s": a["requests_per_s"],
            "p50": a["ack_latency_ms"]["p50"],
            "p99": a["ack_latency_ms"]["p99"],
            "cpu": s.get("cpu_s_per_million_records"),
            "rss": s.get("vm_hwm_mb"),
            "rss sampled": s.get("rss_mb_peak_sampled"),
        }[key]
    return get


def catch_up_cpu(r):
    # Server CPU seconds per GiB served, 16 readers (the steadiest of the reads).
    n = r["catch_up_n"]
    return n["server_cpu_s"] / (n["readers"] * r["stream_bytes"] / 2**30)


ROWS = [
    ("1 KiB JSON x 1/request, 512 conns, 64 streams", "many", "appends/s", bench("appends/s"), 0),
    ("", "many", "server CPU us/record", bench("cpu"), 1),
    ("", "many", "peak RSS (VmHWM) MiB", bench("rss"), 0),
    ("", "many", "RSS, highest sample MiB", bench("rss sampled"), 0),
    ("", "many", "ack p99 ms", bench("p99"), 1),
    ("100 B JSON x 10/request, 64 conns, 4 streams", "batched", "records/s", bench("records/s"), 0),
    ("", "batched", "server CPU us/record", bench("cpu"), 2),
    ("", "batched", "peak RSS (VmHWM) MiB", bench("rss"), 0),
    ("", "batched", "RSS, highest sample MiB", bench("rss sampled"), 0),
    ("", "batched", "ack p99 ms", bench("p99"), 1),
    ("lone 100 B append, 5/s, after the 1 KiB load", "lone", "ack p50 ms", bench("p50"), 2),
    ("", "lone", "ack p99 ms", bench("p99"), 2),
    ("catch-up, one 256 MiB stream, warm", "bytes", "1 reader MiB/s",
     lambda r: max(p["mib_per_s"] for p in r["catch_up_1"]), 0),
    ("", "bytes", "16 readers MiB/s (all)", lambda r: r["catch_up_n"]["mib_per_s"], 0),
    ("", "bytes", "server CPU s/GiB (16 readers)", catch_up_cpu, 2),
    ("one connection, sequential 64 KiB appends", "bytes", "MiB/s",
     lambda r: r["sequential"]["mib_per_s"], 0),
    ("", "bytes", "append p50 ms", lambda r: r["sequential"]["append_ms_p50"], 2),
    ("", "bytes", "peak RSS (VmHWM) MiB, after the reads", lambda r: r["server_vm_hwm_mib"], 0),
    ("", "bytes", "RSS after the reads MiB", lambda r: r["server_rss_mib"], 0),
]


def fmt(v, digits):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def main():
    d, rounds = sys.argv[1], int(sys.argv[2])
    head = ["workload", "figure"]
    for _, name in SERVERS:
        head += [f"{name} r{k}" for k in range(1, rounds + 1)]
    head += [f"Electric/PicoMQ r{k}" for k in range(1, rounds + 1)]
    lines, summary = [head], []
    for what, scenario, figure, get, digits in ROWS:
        vals = {}
        for server, _ in SERVERS:
            for k in range(1, rounds + 1):
                r = load(d, scenario, server, k)
                try:
                    vals[server, k] = None if r is None else get(r)
                except (KeyError, TypeError, ZeroDivisionError):
                    vals[server, k] = None
        if all(v is None for v in vals.values()):
            continue
        row = [what, figure]
        row += [fmt(vals[s, k], digits) for s, _ in SERVERS for k in range(1, rounds + 1)]
        ratios = []
        for k in range(1, rounds + 1):
            p, e = vals["picomq", k], vals["electric", k]
            ratios.append(e / p if p and e is not None else None)
        row += ["-" if x is None else f"{x:.2f}x" for x in ratios]
        lines.append(row)
        summary.append({"scenario": scenario, "workload": what, "figure": figure,
                        "picomq": [vals["picomq", k] for k in range(1, rounds + 1)],
                        "electric": [vals["electric", k] for k in range(1, rounds + 1)],
                        "electric_over_picomq": ratios})
    for row in lines:
        print("\t".join(row))
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
