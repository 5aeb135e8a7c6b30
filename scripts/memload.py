#!/usr/bin/env python3
"""Memory under load: N concurrent streaming chat requests through a running Switchyard, with
the RSS of the given processes sampled while they run (stdlib only, loopback).

    scripts/memload.py --url http://127.0.0.1:8080 --streams 2000 --pids 123,456

Prints idle RSS, peak RSS during the run and RSS 10 s after, per process and summed, plus the
status counts. Each request is `stream: true` on the model given by --model; use a mock target
whose base URL slows the chunks (e.g. `/x/chunks=20,chunk_delay_ms=250/v1`) so that all the
streams are open at the same time. See docs/BENCHMARKS.md (Memory).
"""

import argparse
import asyncio
import collections
import json
import time


def threads(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0


async def one(host, port, body, key, counts, open_now, peak_open):
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        counts[f"connect {e.errno}"] += 1
        return
    try:
        req = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        writer.write(req)
        await writer.drain()
        status = await reader.readline()
        code = status.split()[1].decode() if len(status.split()) > 1 else "?"
        open_now[0] += 1
        peak_open[0] = max(peak_open[0], open_now[0])
        data = await reader.read()
        open_now[0] -= 1
        ok = code == "200" and b"[DONE]" in data
        counts[code if ok or code != "200" else "200 without [DONE]"] += 1
    except Exception as e:  # noqa: BLE001 - counted and reported
        counts[type(e).__name__] += 1
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--model", default="mem/stream")
    ap.add_argument("--key", default="sk-mem-0123456789abcdef")
    ap.add_argument("--pids", required=True, help="comma-separated PIDs to sample")
    ap.add_argument("--ramp-s", type=float, default=2.0, help="open the streams over this long")
    ap.add_argument("--after-s", type=float, default=10.0)
    a = ap.parse_args()
    host, port = a.url.split("//")[1].split(":")
    port = int(port)
    pids = [int(p) for p in a.pids.split(",")]
    body = json.dumps(
        {
            "model": a.model,
            "stream": True,
            "messages": [{"role": "user", "content": "Tell me about API gateways."}],
        }
    ).encode()
    idle = {p: rss_mb(p) for p in pids}
    peak = dict(idle)
    counts = collections.Counter()
    open_now, peak_open = [0], [0]
    done = asyncio.Event()

    peak_sum = [sum(idle.values())]
    peak_threads = {}

    async def sample():
        while not done.is_set():
            now = {p: rss_mb(p) for p in pids}
            for p in pids:
                peak[p] = max(peak[p], now[p])
            peak_sum[0] = max(peak_sum[0], sum(now.values()))
            for p in pids:
                peak_threads[p] = max(peak_threads.get(p, 0), threads(p))
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    tasks = []
    for i in range(a.streams):
        tasks.append(asyncio.create_task(one(host, port, body, a.key, counts, open_now, peak_open)))
        if a.ramp_s > 0 and i % 50 == 49:
            await asyncio.sleep(a.ramp_s * 50 / a.streams)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    done.set()
    await sampler
    await asyncio.sleep(a.after_s)
    after = {p: rss_mb(p) for p in pids}
    print(f"streams {a.streams}, peak open {peak_open[0]}, {elapsed:.1f} s, results {dict(counts)}")
    for p in pids:
        print(f"pid {p}: idle {idle[p]:.0f} MB, peak {peak[p]:.0f} MB, {a.after_s:.0f} s after {after[p]:.0f} MB, "
              f"threads {threads(p)} (peak {peak_threads.get(p, 0)})")
    print(
        f"sum: idle {sum(idle.values()):.0f} MB, peak {peak_sum[0]:.0f} MB, "
        f"after {sum(after.values()):.0f} MB"
    )


if __name__ == "__main__":
    asyncio.run(main())
