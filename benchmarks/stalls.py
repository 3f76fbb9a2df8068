#!/usr/bin/env python3
"""Where a latency tail came from: read a `picomq bench --trace FILE` and print the
measured window's acknowledgement percentiles, then the time slices (by when requests
were due) holding requests slower than the p99, merged into runs. A tail made of a few
runs is stalls (the server, its disk or the machine stopped for that long); one spread
thin over the whole window is queueing.

    python3 benchmarks/stalls.py TRACE [SLICE_MS] [--syncs PERF_SCRIPT] [--cpu SAMPLES]

(default slice: 20 ms). Each run is printed with its start on CLOCK_MONOTONIC too, to
find it in a `perf record -k CLOCK_MONOTONIC` taken alongside. With --syncs, the
output of `perf script -F tid,time,event` over the fdatasync tracepoints
(syscalls:sys_enter_fdatasync / sys_exit_fdatasync, as benchmarks/stalls.sh records
them), each run also names the slowest fdatasync that was under way during it or in
the 100 ms before it. With --cpu, the samples of benchmarks/cpu-sample.py taken
alongside, each run also gets the machine's steal and idle shares over it and the 50 ms
before it, against the whole window's and the spread over its 100 ms slices.
"""
import re
import sys

SYNC_LINE = re.compile(r"^\s*(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_fdatasync")


def load_syncs(path):
    """(start_us, end_us) of every fdatasync in a perf script, on CLOCK_MONOTONIC."""
    open_at, spans = {}, []
    with open(path) as f:
        for line in f:
            m = SYNC_LINE.match(line)
            if not m:
                continue
            tid, t, kind = m.group(1), int(float(m.group(2)) * 1e6), m.group(3)
            if kind == "enter":
                open_at[tid] = t
            elif tid in open_at:
                spans.append((open_at.pop(tid), t))
    return sorted(spans)


def load_cpu(path):
    """(monotonic_us, [user nice system idle iowait irq softirq steal]) samples."""
    samples = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 9:
                samples.append((int(parts[0]), [int(x) for x in parts[1:]]))
    return samples


def cpu_share(samples, lo_us, hi_us):
    """(steal, idle) shares of all CPU ticks between the last sample at or before
    `lo_us` and the first at or after `hi_us`; None when there are no such two."""
    before = [s for s in samples if s[0] <= lo_us]
    after = [s for s in samples if s[0] >= hi_us]
    if not before or not after:
        return None
    a, b = before[-1][1], after[0][1]
    ticks = [y - x for x, y in zip(a, b)]
    total = sum(ticks)
    if total == 0:
        return None
    return ticks[7] / total, ticks[3] / total


def take_option(args, name, load):
    """Removes `name FILE` from args and returns load(FILE), or None without it."""
    if name not in args:
        return None
    i = args.index(name)
    if i + 1 >= len(args):
        sys.exit(__doc__)
    value = load(args[i + 1])
    del args[i : i + 2]
    return value


def main():
    args = sys.argv[1:]
    cpu = take_option(args, "--cpu", load_cpu)
    syncs = take_option(args, "--syncs", load_syncs)
    if len(args) not in (1, 2):
        sys.exit(__doc__)
    path = args[0]
    slice_us = int(float(args[1]) * 1000) if len(args) == 2 else 20_000
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
    head = "  from (s into window)  monotonic s      length ms  above p99  worst ms  send lag ms"
    head += "  slowest fdatasync ms" if syncs is not None else ""
    print(head + ("  steal  idle" if cpu is not None else ""))
    for first, last, n, worst, lag in runs[:15]:
        at = window[0] + first * slice_us
        line = (
            f"  {(at - window[0]) / 1e6:19.3f}  {(at + zero) / 1e6:13.3f}"
            f"  {(last - first + 1) * slice_us / 1000:9.0f}  {n:9d}  {worst:8.1f}  {lag:11.1f}"
        )
        if syncs is not None:
            lo, hi = at + zero - 100_000, window[0] + (last + 1) * slice_us + zero
            near = [e - s for s, e in syncs if s < hi and e > lo]
            line += f"  {max(near) / 1000:20.1f}" if near else f"  {'-':>20}"
        if cpu is not None:
            end = window[0] + (last + 1) * slice_us + zero
            share = cpu_share(cpu, at + zero - 50_000, end)
            line += f"  {share[0]:5.0%}  {share[1]:4.0%}" if share else "      -     -"
        print(line)
    share = sum(r[2] for r in runs[:3]) / above if above else 0
    print(f"the three largest runs hold {share:.0%} of the requests above the p99")
    if cpu:
        whole = cpu_share(cpu, window[0] + zero, window[1] + zero)
        slices = [
            cpu_share(cpu, t, t + 100_000)
            for t in range(window[0] + zero, window[1] + zero - 100_000, 100_000)
        ]
        steal = sorted(x[0] for x in slices if x)
        if whole and steal:
            print(
                f"machine over the window: steal {whole[0]:.1%}, idle {whole[1]:.1%}; steal per "
                f"100 ms slice p50 {steal[len(steal) // 2]:.0%}, p90 "
                f"{steal[int(len(steal) * 0.9)]:.0%}, max {steal[-1]:.0%}"
            )
    if syncs:
        durations = sorted((e - s) / 1000 for s, e in syncs)
        slow = sum(1 for d in durations if d > 10)
        print(
            f"fdatasync: {len(durations)} in the trace, p50 {durations[len(durations) // 2]:.2f} ms, "
            f"p99 {durations[int(len(durations) * 0.99)]:.2f}, max {durations[-1]:.1f}, "
            f"{slow} over 10 ms"
        )


if __name__ == "__main__":
    main()
