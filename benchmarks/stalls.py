#!/usr/bin/env python3
"""Where a latency tail came from: read a `picomq bench --trace FILE` and print the
measured window's acknowledgement percentiles, then the time slices (by when requests
were due) holding requests slower than the p99, merged into runs. A tail made of a few
runs is stalls (the server, its disk or the machine stopped for that long); one spread
thin over the whole window is queueing.

    python3 benchmarks/stalls.py TRACE [SLICE_MS]      (default slice: 20 ms)

Each run is printed with its start on CLOCK_MONOTONIC too, to find it in a
`perf record -k CLOCK_MONOTONIC` taken alongside (perf script prints those seconds).
"""
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    path = sys.argv[1]
    slice_us = int(float(sys.argv[2]) * 1000) if len(sys.argv) == 3 else 20_000
    if slice_us <= 0:
        sys.exit("SLICE_MS must be positive")
    window, zero, rows = None, None, []
    with open(path) as f:
        for line in f:
            if line.startswith("# window_us"):
                window = tuple(int(x) for x in line.split()[2:4])
            elif line.startswith("# clock_monotonic_us_at_zero"):
                zero = int(line.split()[2])
            elif line.strip() and not line.startswith("#"):
                due, sent, acked, status = (int(x) for x in line.split())
                rows.append((due, sent, acked, status))
    if window is None or zero is None:
        sys.exit(f"{path}: not a picomq bench --trace file")
    measured = [r for r in rows if window[0] <= r[0] < window[1]]
    if not measured:
        sys.exit(f"{path}: no request was due inside the measured window")
    lat = sorted((r[2] - r[0]) / 1000 for r in measured)

    def q(p):
        return lat[min(len(lat) - 1, int(len(lat) * p))]

    p99 = q(0.99)
    failed = sum(1 for r in measured if not 200 <= r[3] < 300)
    print(
        f"{len(measured)} requests due in the window, {failed} not acknowledged; "
        f"ack ms p50 {q(0.5):.2f}  p99 {p99:.2f}  p99.9 {q(0.999):.2f}  max {lat[-1]:.2f}"
    )
    slow = {}
    for due, sent, acked, _ in measured:
        ms = (acked - due) / 1000
        if ms > p99:
            k = (due - window[0]) // slice_us
            n, worst, lag = slow.get(k, (0, 0.0, 0.0))
            slow[k] = (n + 1, max(worst, ms), max(lag, (sent - due) / 1000))
    runs = []
    for k in sorted(slow):
        n, worst, lag = slow[k]
        if runs and runs[-1][1] == k - 1:
            r = runs[-1]
            runs[-1] = [r[0], k, r[2] + n, max(r[3], worst), max(r[4], lag)]
        else:
            runs.append([k, k, n, worst, lag])
    above = sum(r[2] for r in runs)
    runs.sort(key=lambda r: -r[2])
    print(
        f"{above} requests above the p99 in {len(runs)} runs of {slice_us / 1000:g} ms "
        f"slices; the largest:"
    )
    print("  from (s into window)  monotonic s      length ms  above p99  worst ms  send lag ms")
    for first, last, n, worst, lag in runs[:15]:
        at = window[0] + first * slice_us
        print(
            f"  {(at - window[0]) / 1e6:19.3f}  {(at + zero) / 1e6:13.3f}"
            f"  {(last - first + 1) * slice_us / 1000:9.0f}  {n:9d}  {worst:8.1f}  {lag:11.1f}"
        )
    share = sum(r[2] for r in runs[:3]) / above if above else 0
    print(f"the three largest runs hold {share:.0%} of the requests above the p99")


if __name__ == "__main__":
    main()
