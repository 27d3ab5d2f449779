"""Training throughput of the BB-α loss: vectorised K passes vs a sequential loop, in one run.

    python bench/train_throughput.py [--steps 10] [--batch-size 128] [--k 10] [--device auto]

For each preset (paper MLP 3×1000 and CNN) and K, one optimiser step on a batch of random MNIST-
shaped inputs is timed (median over ``--steps``) two ways:
- sequential: ``torch.stack([model(x) for _ in range(K)], 1)`` — K full forward passes;
- vectorised: :func:`bayesgate.models.mc.engine.mc_logits` — trunk once, head on ``K·B`` rows.
It prints examples·K per second for both and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bayesgate.models.device import pick_device
from bayesgate.models.mc.engine import mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss, l2_penalty
from bayesgate.models.networks.registry import build_network, preset_architecture


def step_time(
    model: torch.nn.Module,
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    device: torch.device,
) -> float:
    """Median seconds of one full training step (forward, BB-α loss, backward, Adam)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for i in range(steps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = bbalpha_softmax_loss(forward(x), y, 0.5) + 1e-6 * l2_penalty(model)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    args = parser.parse_args()
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.rand(args.batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    k = args.k
    print(
        f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"batch {args.batch_size}, K={k}\n"
    )
    print(
        "| preset | sequential ex·K/s | vectorised ex·K/s | speed-up | epoch of 50k (vectorised) |"
    )
    print("|---|---:|---:|---:|---:|")
    for preset in ("mlp-3x1000", "cnn"):
        model = build_network(preset_architecture(preset)).to(device).train()

        def seq(inp: torch.Tensor, model: torch.nn.Module = model) -> torch.Tensor:
            return torch.stack([model(inp) for _ in range(k)], dim=1)

        def vec(inp: torch.Tensor, model: torch.nn.Module = model) -> torch.Tensor:
            return mc_logits(model, inp, k)

        t_seq = step_time(model, seq, x, y, args.steps, device)
        t_vec = step_time(model, vec, x, y, args.steps, device)
        rate_seq = args.batch_size * k / t_seq
        rate_vec = args.batch_size * k / t_vec
        print(
            f"| {preset} | {rate_seq:,.0f} | {rate_vec:,.0f} | {t_seq / t_vec:.2f}x | "
            f"{50_000 / args.batch_size * t_vec:.0f} s |"
        )


if __name__ == "__main__":
    main()
