"""Benchmark of the MC inference engine; every ratio is measured within this one run.

    python bench/mc_engine.py [--repeats 20] [--device auto] [--json out.json]

Rows of the table:
1. paper MLP (3×1000, p=0.5), K=10, batch 1/32/256: a sequential loop of K forward passes vs the
   vectorised engine (one forward over K·B rows).            target ≥ 4× at batch 1
2. paper CNN, K=10: replicate-everything (the input repeated K times through the whole net) vs the
   trunk-shared engine (conv stack once, head on K·B rows).   target ≥ 3×
3. achieved model FLOP/s of the vectorised MLP at batch ≥ 64 as a fraction of the same process's
   dense fp32 matmul FLOP/s (the machine's roofline).         target ≥ 70%
4. peak memory per 1k rows of the vectorised MLP and CNN head, measured in a fresh subprocess
   (peak RSS on CPU, ``max_memory_allocated`` on CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from bayesgate.models.device import pick_device
from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.networks.registry import build_network, preset_architecture

K = 10


def timeit(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median seconds per call after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sequential(model: torch.nn.Module, x: torch.Tensor, k: int) -> torch.Tensor:
    """The textbook loop: K full forward passes with dropout on, stacked to B×K×C."""
    with torch.inference_mode(), mc_sampling():
        return torch.stack([torch.softmax(model(x), -1) for _ in range(k)], dim=1)


def replicate_all(model: torch.nn.Module, x: torch.Tensor, k: int) -> torch.Tensor:
    """Vectorised but naive: the input repeated K times through trunk and head."""
    with torch.inference_mode(), mc_sampling():
        rows = x.repeat_interleave(k, dim=0)
        return torch.softmax(model(rows), -1).view(x.shape[0], k, -1)


def mlp_flops(model: torch.nn.Module, rows: int) -> float:
    """2·rows·Σ d_in·d_out for the Linear layers (the matmul work; elementwise ops excluded)."""
    return (
        2.0
        * rows
        * sum(
            m.in_features * m.out_features
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        )
    )


def matmul_roofline(device: torch.device, repeats: int, n: int = 2048) -> float:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    seconds = timeit(lambda: a @ b, repeats, device)
    return 2.0 * n**3 / seconds


def peak_memory_per_1k_rows(preset: str, rows: int, device: str) -> float:
    """MiB of peak memory per 1000 K·B rows, from a fresh interpreter.

    CUDA: ``max_memory_allocated`` minus the allocation before the call. CPU: a thread samples the
    resident set size (``/proc/self/statm``) every 0.5 ms during the call; peak minus the RSS
    before it. Large CPU tensors are mmapped and returned on free, so RSS tracks them.
    """
    code = f"""
import os, threading, time, torch
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.networks.registry import build_network, preset_architecture
dev = torch.device({device!r})
m = build_network(preset_architecture({preset!r})).to(dev).eval()
x = torch.rand({rows} // {K}, 1, 28, 28, device=dev)
mc_predict(m, x[:1], 1)
page = os.sysconf('SC_PAGE_SIZE')
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * page
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss()); time.sleep(0.0005)
if dev.type == 'cuda':
    torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
else:
    base = rss(); t = threading.Thread(target=sample); t.start()
mc_predict(m, x, {K}, max_rows={rows})
if dev.type == 'cuda':
    used = torch.cuda.max_memory_allocated() - base
else:
    done.set(); t.join(); used = peak[0] - base
print(used / 2**20 / ({rows} / 1000))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows: list[dict[str, object]] = []

    mlp = build_network(preset_architecture("mlp-3x1000")).to(device).eval()
    for batch in (1, 32, 256):
        x = torch.rand(batch, 1, 28, 28, device=device)
        t_seq = timeit(lambda x=x: sequential(mlp, x, K), args.repeats, device)
        t_vec = timeit(lambda x=x: mc_predict(mlp, x, K), args.repeats, device)
        rows.append(
            {
                "case": f"MLP 3x1000 B={batch}",
                "baseline": "sequential K loop",
                "baseline_ms": t_seq * 1e3,
                "engine_ms": t_vec * 1e3,
                "speedup": t_seq / t_vec,
                "target": ">= 4x" if batch == 1 else "",
            }
        )

    cnn = build_network(preset_architecture("cnn")).to(device).eval()
    for batch in (32, 256):
        x = torch.rand(batch, 1, 28, 28, device=device)
        t_rep = timeit(lambda x=x: replicate_all(cnn, x, K), max(3, args.repeats // 4), device)
        t_vec = timeit(lambda x=x: mc_predict(cnn, x, K), max(3, args.repeats // 4), device)
        rows.append(
            {
                "case": f"CNN B={batch}",
                "baseline": "replicate everything",
                "baseline_ms": t_rep * 1e3,
                "engine_ms": t_vec * 1e3,
                "speedup": t_rep / t_vec,
                "target": ">= 3x",
            }
        )

    roof = matmul_roofline(device, args.repeats)
    roofline = []
    for batch in (64, 256):
        x = torch.rand(batch, 1, 28, 28, device=device)
        t_vec = timeit(lambda x=x: mc_predict(mlp, x, K), args.repeats, device)
        flops = mlp_flops(mlp, batch * K) / t_vec
        roofline.append(
            {
                "batch": batch,
                "model_gflops": flops / 1e9,
                "matmul_gflops": roof / 1e9,
                "fraction": flops / roof,
            }
        )

    memory = {p: peak_memory_per_1k_rows(p, 8192, str(device)) for p in ("mlp-3x1000", "cnn")}

    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, K={K}\n")
    print("| case | baseline | baseline ms | engine ms | speed-up | target |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['baseline']} | {r['baseline_ms']:.2f} | {r['engine_ms']:.2f} | "
            f"{r['speedup']:.1f}x | {r['target']} |"
        )
    print("\n| MLP 3x1000, K=10 | model GFLOP/s | matmul GFLOP/s (2048^2) | fraction of roofline |")
    print("|---|---:|---:|---:|")
    for r in roofline:
        print(
            f"| B={r['batch']} | {r['model_gflops']:.1f} | {r['matmul_gflops']:.1f} "
            f"| {r['fraction']:.0%} |"
        )
    print("\n| network | peak MiB per 1k K·B rows |")
    print("|---|---:|")
    for name, mib in memory.items():
        print(f"| {name} | {mib:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"speedups": rows, "roofline": roofline, "memory_mib_per_1k_rows": memory},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
