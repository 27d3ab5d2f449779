"""Ray Serve with 1 vs 2 replicas: throughput, against plain ``bayesgate serve`` as reference.

Starts, one after the other and each on a free 127.0.0.1 port, (a) ``bayesgate serve`` (one
process: the reference), then ``bayesgate serve --ray`` (a local single-node Ray instance, the
app behind Ray's HTTP proxy) with ``BAYESGATE_RAY_NUM_REPLICAS`` = each of ``--replicas``
(default 1 then 2). Every server gets the same settings as ``bench/load.py``'s batching mode
(max batch ``--max-batch-size``, ``--threads`` torch threads, queue capacity ≥ 4 × clients, log
level warning) and the same load: ``--clients`` concurrent keep-alive connections for
``--duration`` seconds (at most ``--max-requests`` requests), every request one MNIST test image
at K = ``--k``, after a short warm-up. A server counts as ready when ``GET /readyz`` has answered
200 from every replica (``--start-timeout``, default 180 s; Ray needs 10–30 s on 2 cores); it is
always stopped with SIGINT (killed after ``--stop-timeout``), and any process of its tree still
alive after that (a Ray worker left behind) is killed by pid.

Per row it reports throughput, p50/p95/p99 latency, the mean batch the engines ran, and CPU in
cores (CPU seconds ÷ wall seconds): the server's whole process tree (for Ray: driver, GCS,
raylet, proxy, controller, replicas — also split by role), this client process, and the whole
machine, so that load from anything else shows up. For the Ray rows it counts the answers per
replica from the ``X-BayesGate-Replica`` header and reads each replica's ``/v1/stats`` (through
the proxy, until every replica has answered) for its batch sizes and engine busy time. Then the
ratios measured in this run: 2 replicas ÷ 1 replica (the scaling) and Ray 1 replica ÷ plain
serve (the cost of the proxy hop).

    BAYESGATE_DATA_DIR=/work/shared/data python bench/ray_replicas.py --duration 10 \\
        --json docs/bench/ray_replicas.json

Needs Linux (/proc, for the CPU and process-tree accounting) and the ``ray`` extra. Traffic goes
to 127.0.0.1 only; every loop is bounded in time and count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from load import (
    BUNDLED,
    MAX_DURATION_S,
    Request,
    Server,
    add_load_options,
    drive,
    free_port,
    latency_stats,
    mnist_images,
    server_env,
    table,
)

REPLICA_HEADER = (
    "x-bayesgate-replica"  # = bayesgate.service.ray_app.REPLICA_HEADER (not imported: no ray)
)
PLAIN = "-"  # replica name of plain `bayesgate serve` (no header)
MAX_HEADER_LINES = 100
MAX_BODY_BYTES = 16 * 1024 * 1024
POLL_S = 0.25
STATS_ATTEMPTS = 150  # GET /v1/stats through the proxy until every replica has answered ...
STATS_PAUSE_S = 0.1  # ... spaced out: Ray's router keeps picking a replica it believes idle
OUTSIDE_WARN = 0.25  # cores used by neither server nor client: worth a warning
REAP_GRACE_S = 15.0  # after the server stopped: wait this long for its process tree to exit
ROLES = (  # (role, process-title prefix); anything else in the tree is "other"
    ("replicas", "ray::ServeReplica"),
    ("proxy", "ray::ProxyActor"),
    ("controller", "ray::ServeController"),
)


# --- HTTP: one exchange, with the response headers ---------------------------------------------


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
) -> tuple[int, dict[str, str]]:
    """One HTTP/1.1 keep-alive request; returns (status, headers with lower-case names).

    The body is read and dropped, framed by ``Content-Length`` or ``Transfer-Encoding:
    chunked`` (Ray's proxy may stream); a repeated header keeps its values joined by ``, ``.
    Raises ``ConnectionError`` when the server closes the connection or the answer is malformed.
    """
    writer.write(payload)
    await writer.drain()
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"no HTTP status line (got {status_line[:80]!r})")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ConnectionError(f"malformed header line {line[:80]!r}")
        key, text = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    else:
        raise ConnectionError(f"more than {MAX_HEADER_LINES} header lines")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _read_chunked(reader)
    else:
        length = int(headers.get("content-length", "0"))
        if not 0 <= length <= MAX_BODY_BYTES:
            raise ConnectionError(f"unexpected Content-Length {length}")
        await reader.readexactly(length)
    return int(parts[1]), headers


async def _read_chunked(reader: asyncio.StreamReader) -> None:
    total = 0
    while total <= MAX_BODY_BYTES:  # bounded: every chunk adds its size, the last one ends it
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            for _ in range(MAX_HEADER_LINES):  # trailers up to the blank line
                if (await reader.readline()) in (b"\r\n", b"\n", b""):
                    return
            raise ConnectionError("endless chunked trailer")
        await reader.readexactly(size + 2)  # the chunk and its CRLF
        total += size
    raise ConnectionError(f"chunked body over {MAX_BODY_BYTES} bytes")


def counting(answers: Counter[str]) -> Request:
    """A request function for :func:`load.drive` that also counts each 200 answer under the
    replica named in its ``X-BayesGate-Replica`` header (``-`` without one)."""

    async def request(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
    ) -> int:
        status, headers = await exchange(reader, writer, payload)
        if status == 200:
            answers[headers.get(REPLICA_HEADER, PLAIN)] += 1
        return status

    return request


def get_json(base: str, path: str) -> tuple[int, str, Any]:
    """GET ``base + path`` on a fresh connection (never via a proxy): (status, replica, body)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(base + path, timeout=5) as r:
            return r.status, r.headers.get(REPLICA_HEADER, PLAIN), json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get(REPLICA_HEADER, PLAIN), None


# --- processes: the server's tree and its CPU time --------------------------------------------


def _stat(pid: int) -> tuple[int, str, float, int] | None:
    """(parent pid, state, user + system CPU seconds, start time in ticks) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), fields[0], (int(fields[11]) + int(fields[12])) / ticks, int(fields[19])


def process_tree(root: int) -> dict[int, int]:
    """``root`` and its living descendants: pid → start time (to tell a reused pid apart)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and st[1] != "Z":
            children.setdefault(st[0], []).append(int(entry.name))
            starts[int(entry.name)] = st[3]
    tree, todo = {}, [root]
    while todo and len(tree) < 10_000:
        pid = todo.pop()
        if pid in starts and pid not in tree:
            tree[pid] = starts[pid]
            todo.extend(children.get(pid, ()))
    return tree


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, over all cores (/proc/stat)."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, line[1:9])
    except (OSError, IndexError, ValueError):
        return float("nan"), float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / ticks, steal / ticks


def role(pid: int, root: int) -> str:
    if pid == root:
        return "server"
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    return next((name for name, prefix in ROLES if title.startswith(prefix)), "other")


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process in ``root``'s tree: pid → (role, seconds)."""
    out = {}
    for pid in process_tree(root):
        st = _stat(pid)
        if st is not None:
            out[pid] = (role(pid, root), st[2])
    return out


def cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between the snapshots, per role (a process new since ``before`` counts
    from zero; one gone by ``after`` is lost — none should come or go while measuring)."""
    spent: Counter[str] = Counter()
    for pid, (name, seconds) in after.items():
        spent[name] += seconds - before.get(pid, (name, 0.0))[1]
    return dict(spent)


def reap(seen: dict[int, int]) -> list[int]:
    """Wait for the processes of a stopped server to exit; kill (by pid) those still alive after
    :data:`REAP_GRACE_S`. Returns the pids that had to be killed."""

    def alive() -> list[int]:
        return [
            pid
            for pid, start in seen.items()
            if (st := _stat(pid)) is not None and st[3] == start and st[1] != "Z"
        ]

    deadline = time.monotonic() + REAP_GRACE_S
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        print(f"warning: killed {len(left)} leftover server process(es): {left}", file=sys.stderr)
    return left


# --- one row --------------------------------------------------------------------------------------


def wait_all_ready(server: Server, replicas: int, timeout_s: float, seen: dict[int, int]) -> float:
    """Poll ``/readyz`` until it has answered 200 from ``replicas`` distinct replicas; returns the
    seconds it took. ``seen`` collects the server's process tree along the way."""
    start = time.monotonic()
    ready: set[str] = set()
    while time.monotonic() - start < timeout_s:
        seen.update(process_tree(server.proc.pid))
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited: {server.stderr_text()[-4000:]}")
        with contextlib.suppress(OSError, ValueError):
            status, replica, _ = get_json(server.base, "/readyz")
            if status == 200:
                ready.add(replica)
                if len(ready) >= replicas:
                    return time.monotonic() - start
        time.sleep(POLL_S)
    raise RuntimeError(
        f"not ready after {timeout_s:g} s ({len(ready)} of {replicas} replicas answered); "
        f"server stderr: {server.stderr_text()[-4000:]}"
    )


def replica_stats(base: str, replicas: set[str]) -> dict[str, dict[str, Any]]:
    """``/v1/stats`` of each replica in ``replicas`` (asked through the proxy, which picks the
    replica: at most :data:`STATS_ATTEMPTS` requests, :data:`STATS_PAUSE_S` apart)."""
    found: dict[str, dict[str, Any]] = {}
    for _ in range(STATS_ATTEMPTS):
        with contextlib.suppress(OSError, ValueError):
            status, replica, body = get_json(base, "/v1/stats")
            if status == 200 and replica not in found:
                found[replica] = body
        if replicas <= found.keys():
            break
        time.sleep(STATS_PAUSE_S)
    return found


def run_row(
    name: str, replicas: int | None, model_dir: Path, bodies: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    """One server (``replicas`` None: plain ``bayesgate serve``), warmed up and measured."""
    env = server_env(args, args.max_batch_size)
    extra: list[str] = []
    if replicas is not None:
        env["BAYESGATE_RAY_NUM_REPLICAS"] = str(replicas)
        extra = ["--ray"]
    seen: dict[int, int] = {}  # every process of the server's tree ever seen (pid → start)
    port = free_port()
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(reap, seen)  # runs last: after the server's own stop
        server = stack.enter_context(
            Server(model_dir, port, env, extra, stop_timeout_s=args.stop_timeout)
        )
        stack.callback(lambda: seen.update(process_tree(server.proc.pid)))  # runs first
        startup_s = wait_all_ready(server, replicas or 1, args.start_timeout, seen)
        warm: Counter[str] = Counter()
        asyncio.run(
            drive(port, bodies, args.clients, min(2.0, args.duration), 10_000, counting(warm))
        )
        seen.update(process_tree(server.proc.pid))
        stats0 = replica_stats(server.base, set(warm))
        answers: Counter[str] = Counter()
        cpu0, client0, machine0 = tree_cpu(server.proc.pid), time.process_time(), machine_cpu()
        latencies, failures, wall = asyncio.run(
            drive(port, bodies, args.clients, args.duration, args.max_requests, counting(answers))
        )
        cpu1, client1, machine1 = tree_cpu(server.proc.pid), time.process_time(), machine_cpu()
        stats1 = replica_stats(server.base, set(answers))
        stop_at = time.monotonic()
    stop_s = time.monotonic() - stop_at
    total_s = time.monotonic() - t0

    per_replica: dict[str, dict[str, Any]] = {}
    for i, (replica, count) in enumerate(answers.most_common()):
        entry: dict[str, Any] = {"id": replica, "answers": count, "share": count / len(latencies)}
        if replica in stats0 and replica in stats1:
            calls = stats1[replica]["engine_calls"] - stats0[replica]["engine_calls"]
            instances = stats1[replica]["instances"] - stats0[replica]["instances"]
            busy = (
                stats1[replica]["compute_seconds_total"] - stats0[replica]["compute_seconds_total"]
            )
            entry |= {
                "engine_calls": calls,
                "instances": instances,
                "mean_batch": instances / calls if calls else 0.0,
                "engine_busy": busy / wall,  # share of the wall time the engine was computing
            }
        per_replica[f"r{i + 1}"] = entry
    complete = all("engine_calls" in e for e in per_replica.values())
    calls = sum(e.get("engine_calls", 0) for e in per_replica.values())
    instances = sum(e.get("instances", 0) for e in per_replica.values())
    spent = cpu_by_role(cpu0, cpu1)
    done = len(latencies)
    server_cpu = sum(spent.values())
    client_cpu = client1 - client0
    machine_busy = machine1[0] - machine0[0]
    return {
        "mode": name,
        "replicas": replicas or 0,
        "max_batch_size": args.max_batch_size,
        **latency_stats(latencies, failures, wall),
        "mean_batch": instances / calls if complete and calls else float("nan"),
        "cpu_ms_per_request": 1000 * server_cpu / done if done else float("nan"),
        "cpu_share": server_cpu / wall,
        "cpu_share_by_role": {k: v / wall for k, v in sorted(spent.items())},
        "client_cpu_share": client_cpu / wall,
        "machine_cpu_share": machine_busy / wall,  # all cores busy, whoever used them
        "outside_cpu_share": (machine_busy - server_cpu - client_cpu) / wall,  # anyone else
        "steal_cpu_share": (machine1[1] - machine0[1]) / wall,
        "server_processes": len(cpu1),
        "per_replica": per_replica,
        "distinct_replicas": len(answers),
        "ready_s": startup_s,
        "stop_s": stop_s,
        "total_s": total_s,
    }


# --- main ---------------------------------------------------------------------------------------


def report(rows: list[dict[str, Any]], ratios: dict[str, float]) -> str:
    lines = [table(rows), ""]
    for r in rows:
        roles = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_share_by_role"].items())
        lines.append(
            f"{r['mode']}: ready in {r['ready_s']:.0f} s, stopped in {r['stop_s']:.0f} s; "
            f"CPU cores used: server tree {r['cpu_share']:.2f} ({roles}; "
            f"{r['server_processes']} processes), client {r['client_cpu_share']:.2f}; "
            f"whole machine {r['machine_cpu_share']:.2f} of {os.cpu_count()} "
            f"(outside server and client {r['outside_cpu_share']:.2f}, "
            f"steal {r['steal_cpu_share']:.2f})"
        )
        if r["replicas"]:
            for key, e in r["per_replica"].items():
                extra = (
                    f", mean batch {e['mean_batch']:.1f}, engine busy {e['engine_busy']:.0%}"
                    if "engine_calls" in e
                    else ", no /v1/stats from it"
                )
                lines.append(
                    f"    {key} {e['id']}: {e['answers']} answers ({e['share']:.0%}){extra}"
                )
        if r["outside_cpu_share"] > OUTSIDE_WARN:
            lines.append(
                f"    warning: {r['outside_cpu_share']:.2f} cores used by other processes "
                "during this row: the machine was not quiet"
            )
    lines.append("")
    for key, value in ratios.items():
        lines.append(f"{key.replace('_', ' '):<40} {value:.2f}×")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=BUNDLED, help="default: the bundled model")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="Ray rows (default 1 2)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain `bayesgate serve` row")
    add_load_options(p, per="row", threads_help="torch threads per server / replica")
    p.add_argument("--start-timeout", type=float, default=180.0, help="seconds (≤ 600)")
    p.add_argument("--stop-timeout", type=float, default=90.0, help="seconds before SIGKILL")
    args = p.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION_S or args.clients < 1 or args.max_requests < 1:
        p.error(f"need 0 < --duration ≤ {MAX_DURATION_S}, --clients ≥ 1, --max-requests ≥ 1")
    if not 0 < args.start_timeout <= 600 or not 0 < args.stop_timeout <= 600:
        p.error("need 0 < --start-timeout, --stop-timeout ≤ 600")
    if not args.replicas or min(args.replicas) < 1 or len(args.replicas) > 8:
        p.error("--replicas: 1 to 8 counts, each ≥ 1")
    if not (args.model_dir / "card.json").is_file():
        p.error(f"no model in {args.model_dir} (card.json missing)")
    leaked = sorted(k for k in os.environ if k.startswith("BAYESGATE_RAY_"))
    if leaked:
        print(f"note: set in this environment and seen by the Ray rows: {leaked}", file=sys.stderr)

    card = json.loads((args.model_dir / "card.json").read_text())
    images = mnist_images(64)
    real_images = bool((images == 0).float().mean() > 0.5)  # MNIST: mostly black; noise: never 0
    bodies = [
        json.dumps({"instances": [img.flatten().tolist()], "mc_samples": args.k}).encode()
        for img in images
    ]
    load_before = os.getloadavg()[0]
    print(
        f"model {card['name']} ({args.model_dir}); K={args.k}; {args.clients} clients; "
        f"{args.duration:g} s per row; {args.threads} torch thread(s) per server/replica; "
        f"max batch {args.max_batch_size}; 1 {'MNIST test' if real_images else 'noise'} image "
        f"per request; {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f}",
        flush=True,
    )
    rows = []
    if not args.no_plain:
        rows.append(run_row("plain serve", None, args.model_dir, bodies, args))
        print(f"  plain serve: {rows[-1]['throughput']:.1f} images/s", flush=True)
    for n in args.replicas:
        rows.append(run_row(f"ray {n} replica{'s' * (n > 1)}", n, args.model_dir, bodies, args))
        print(f"  {rows[-1]['mode']}: {rows[-1]['throughput']:.1f} images/s", flush=True)

    by_replicas = {r["replicas"]: r["throughput"] for r in rows}
    ratios: dict[str, float] = {}
    for n in args.replicas:
        if n != 1 and 1 in by_replicas:
            ratios[f"ray_{n}_replicas_over_ray_1_replica"] = by_replicas[n] / by_replicas[1]
    if 1 in by_replicas and 0 in by_replicas:
        ratios["ray_1_replica_over_plain_serve"] = by_replicas[1] / by_replicas[0]
    print(report(rows, ratios))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": card["name"],
                    "model_dir": str(args.model_dir),
                    "mnist_test_images": real_images,
                    "cpus": os.cpu_count(),
                    "load_average_before": load_before,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rows": rows,
                    **ratios,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
