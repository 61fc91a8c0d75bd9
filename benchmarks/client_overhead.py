"""Does the load client move the timestamps it takes? Token-gap inflation at concurrency 1 vs 64.

A fake OpenAI-compatible server (its own process, asyncio) streams every request's tokens on
a fixed schedule: token k at start + k * interval, by the server's clock. The client's TPOT
(mean gap between the first and last token it stamped) is then compared with that interval:
inflation = median client TPOT / median TPOT the server actually wrote - 1 (the server
stamps its own writes, so its lag on a busy machine is not blamed on the client; the figure
against the nominal schedule is printed too).

Both load clients are measured side by side: the asyncio one (HttpEngine.arun, httpx
AsyncClient, what ``measure_load`` uses) and the thread pool one (HttpEngine.run per thread).

    python benchmarks/client_overhead.py                 # 1 vs 64, 20 ms interval, 64 tokens
    python benchmarks/client_overhead.py --levels 1,8 --tokens 16 --requests 16   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# -- the fake server ----------------------------------------------------------------------------

LATE_MS: list[float] = []
EMITTED_TPOT_MS: list[float] = []  # per request: (last write - first write) / (n - 1), server clock
EMITTED_GAPS_MS: list[float] = []  # every gap between two writes of a request


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, interval_s: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            first, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            if first.startswith("GET /stats"):
                late = sorted(LATE_MS) or [0.0]
                payload = json.dumps(
                    {
                        "events": len(late),
                        "late_ms_p50": late[len(late) // 2],
                        "late_ms_p99": late[int(len(late) * 0.99)],
                        "late_ms_max": late[-1],
                        "emitted_tpot_p50_ms": statistics.median(EMITTED_TPOT_MS) if EMITTED_TPOT_MS else None,
                        "emitted_gap_p50_ms": statistics.median(EMITTED_GAPS_MS) if EMITTED_GAPS_MS else None,
                    }
                ).encode()
                if "reset" in first.split()[1]:
                    LATE_MS.clear()
                    EMITTED_TPOT_MS.clear()
                    EMITTED_GAPS_MS.clear()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload)
                )
                await writer.drain()
                continue
            if first.startswith("GET"):  # /health, /v1/models
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                continue
            n = int(json.loads(body or b"{}").get("max_tokens", 16))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            loop = asyncio.get_running_loop()
            start = loop.time()
            written = []
            for k in range(n):
                delay = start + k * interval_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                LATE_MS.append(max(0.0, (loop.time() - start - k * interval_s) * 1000))
                finish = "length" if k == n - 1 else None
                event = {"choices": [{"index": 0, "text": " tok", "finish_reason": finish}]}
                if finish:
                    event["usage"] = {"prompt_tokens": 4, "completion_tokens": n}
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
                if finish:
                    data += b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                written.append(loop.time())
            if n > 1:
                EMITTED_TPOT_MS.append((written[-1] - written[0]) / (n - 1) * 1000)
                EMITTED_GAPS_MS.extend((b - a) * 1000 for a, b in pairwise(written))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int, interval_s: float) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, interval_s), "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


# -- the client side ----------------------------------------------------------------------------


class ThreadsOnly:
    """The HTTP engine without ``arun`` (no ``AsyncRuns``): measure_load runs it in its thread
    pool. ``concurrent_safe`` makes it a ``ConcurrentRuns`` (the protocols are structural)."""

    concurrent_safe = True

    def __init__(self, engine):
        self._engine = engine

    def run(self, workload, index):
        return self._engine.run(workload, index)

    def info(self):
        return self._engine.info()


def measure(levels: list[int], interval_ms: float, tokens: int, requests: int) -> list[dict]:
    import httpx

    from pytest_llmperf import Workload
    from pytest_llmperf.engines.http import HttpEngine
    from pytest_llmperf.engines.servers import free_port, stop
    from pytest_llmperf.measuring.served import measure_load

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--fake-server", str(port), "--interval-ms", str(interval_ms)],
        stdin=subprocess.DEVNULL,
    )
    results = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("fake server did not start")
            time.sleep(0.05)
        engine = HttpEngine(f"http://127.0.0.1:{port}/v1", request_timeout_s=120)
        for client, subject in (("asyncio", engine), ("threads", ThreadsOnly(engine))):
            for c in levels:
                w = Workload(prompt_tokens=4, max_tokens=tokens, requests=max(requests, c), concurrency=c, warmup=0)
                engine.run(w, -1)  # warm the connection pool's first connection
                httpx.get(f"http://127.0.0.1:{port}/stats/reset", timeout=5)
                m = measure_load(subject, w)
                server = httpx.get(f"http://127.0.0.1:{port}/stats/reset", timeout=5).json()
                tpots = [r.tpot_ms for r in m.runs]
                itl = [g for r in m.runs for g in r.itl_ms]
                emitted = server["emitted_tpot_p50_ms"]
                results.append(
                    {
                        "client": client,
                        "concurrency": c,
                        "requests": m.load.n_ok,
                        "failed": m.load.n_failed,
                        "tpot_p50_ms": statistics.median(tpots),
                        "emitted_tpot_p50_ms": emitted,
                        "inflation": statistics.median(tpots) / emitted - 1,
                        "vs_schedule": statistics.median(tpots) / interval_ms - 1,
                        "itl_p50_ms": statistics.median(itl),
                        "gap_inflation": statistics.median(itl) / server["emitted_gap_p50_ms"] - 1,
                        "itl_p99_ms": sorted(itl)[int(len(itl) * 0.99)],
                        "server_late_p99_ms": server["late_ms_p99"],
                    }
                )
        engine.close()
    finally:
        stop(proc)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-server", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--levels", default="1,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    if args.fake_server:
        asyncio.run(_serve(args.fake_server, args.interval_ms / 1000))
        return
    levels = [int(v) for v in args.levels.split(",")]
    results = measure(levels, args.interval_ms, args.tokens, args.requests)
    print(f"fake stream: one token every {args.interval_ms:g} ms, {args.tokens} tokens per request")
    print("TPOT infl.: median client TPOT / median TPOT the server wrote - 1; gap infl.: median client")
    print("token gap / median gap between the server's writes - 1 (same requests; ms)")
    print(
        f"{'client':8} {'conc':>5} {'ok':>5} {'client TPOT':>12} {'server TPOT':>12} {'TPOT infl.':>11} "
        f"{'gap infl.':>10} {'vs schedule':>12} {'ITL p99':>8} {'srv late p99':>13}"
    )
    for r in results:
        print(
            f"{r['client']:8} {r['concurrency']:>5} {r['requests']:>5} {r['tpot_p50_ms']:>12.3f} "
            f"{r['emitted_tpot_p50_ms']:>12.3f} {r['inflation']:>+11.2%} {r['gap_inflation']:>+10.2%} "
            f"{r['vs_schedule']:>+12.2%} {r['itl_p99_ms']:>8.2f} {r['server_late_p99_ms']:>13.2f}"
        )
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
