#!/usr/bin/env python3
"""Sample the machine's CPU time split every few milliseconds, for lining up with a
`picomq bench --trace` (benchmarks/stalls.py --cpu FILE).

    python3 benchmarks/cpu-sample.py OUT SECONDS [INTERVAL_MS]

Each line: CLOCK_MONOTONIC microseconds, then the first line of /proc/stat (all CPUs
summed, in USER_HZ ticks): user nice system idle iowait irq softirq steal. The kernel
counts in ticks of 10 ms per CPU, so a share over less than ~50 ms is coarse; what
matters is whether a stall's steal (time the hypervisor ran something else while this
VM wanted the CPU) and idle differ from the run's as a whole.
"""
import sys
import time


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out_path, seconds = sys.argv[1], float(sys.argv[2])
    interval = (float(sys.argv[3]) if len(sys.argv) == 4 else 5) / 1000
    end = time.monotonic() + seconds
    # Line-buffered: the sampler may be stopped by a signal at any time.
    with open(out_path, "w", buffering=1) as out, open("/proc/stat") as stat:
        while time.monotonic() < end:
            stat.seek(0)
            fields = stat.readline().split()[1:9]
            out.write(f"{time.monotonic_ns() // 1000} {' '.join(fields)}\n")
            time.sleep(interval)


if __name__ == "__main__":
    main()
