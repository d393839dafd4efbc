#!/usr/bin/python3
"""PyTorch (CPU) training-throughput baseline for bench/bench_train.c.

  torch_train.py --model cnn|mlp|convnet|alexnet|resnet18 [--batch 128]
                 [--input CxHxW] [--classes 10] [--steps 20] [--warmup 3]
                 [--threads 2] [--precision fp32|bf16]
                 [--memory-format contiguous|channels_last]

Same models as ctrain's zoo (torchvision alexnet/resnet18,
tests/parity/ctrain_models.py for cnn/mlp/convnet), same shapes, random
in-memory data, the step a PyTorch user writes (forward, CrossEntropyLoss,
zero_grad(set_to_none=True), backward, Adam.step: no zero fill of the
gradients, PyTorch 2's default and its performance guide's advice, as
ctrain's backward overwrites them); bf16 runs the forward under
torch.autocast("cpu", torch.bfloat16). --memory-format channels_last
converts the model and the batch as PyTorch's CPU performance guide
advises: PyTorch 1.13's oneDNN convolutions then run without reorders,
several times faster on small convolutions (bench/run.sh times both
formats and compares ctrain with the faster). Prints the median step time as
images/s, CPU time / threads (uncontended estimate on a shared machine),
FLOPs (forward conv/linear MACs x2, training = 3x forward) and peak RSS.
Last line: "RESULT key=value ..." for bench/run.sh.
"""
import argparse
import os
import sys

import torch
from torch import nn

from torch_timing import load1, peak_rss_mb, time_steps

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import ctrain_models  # noqa: E402


def convnet(c, classes):
    """ctrain's convnet (src/nn/models/zoo.c), the default of `make train`."""
    return nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.LazyLinear(128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, classes))


def build(name, c, h, w, classes):
    if name == "convnet":
        m = convnet(c, classes)
        m(torch.zeros(1, c, h, w))  # materialise the lazy layer
        return m
    if name == "alexnet" or name == "resnet18":
        import torchvision
        return getattr(torchvision.models, name)(num_classes=classes)
    return ctrain_models.build(name, in_channels=c, height=h, width=w, num_classes=classes)


def forward_macs(model, x):
    """Forward multiply-adds of Conv2d and Linear layers for input x."""
    macs = [0]

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * (mod.in_channels // mod.groups)
            macs[0] += out.numel() * k
        elif isinstance(mod, nn.Linear):
            macs[0] += out.numel() * mod.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()
        model(x)
        model.train()
    for h in hs:
        h.remove()
    return macs[0] / x.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--input", default=None)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--memory-format", default="contiguous", choices=["contiguous", "channels_last"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    defaults = {"alexnet": (3, 227, 227), "resnet18": (3, 32, 32)}
    c, h, w = defaults.get(a.model, (1, 28, 28))
    if a.input:
        c, h, w = (int(v) for v in a.input.split("x"))
    torch.manual_seed(1)
    model = build(a.model, c, h, w, a.classes)
    x = torch.rand(a.batch, c, h, w) * 2 - 1
    y = torch.randint(0, a.classes, (a.batch,))
    macs = forward_macs(model, x[:1])
    if a.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    flop = 3.0 * 2.0 * macs * a.batch
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            out = model(x)
            loss = loss_fn(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    ts, med, cmed, loss = time_steps(step, a.warmup, a.steps, a.threads)
    rss, load = peak_rss_mb(), load1()
    print(f"torch {torch.__version__} {a.model} {a.precision} train step, batch {a.batch}, input {c}x{h}x{w}, "
          f"{a.threads} threads, {a.memory_format}, median of {a.steps} after {a.warmup} warm-up:")
    print(f"  wall: median {med * 1e3:.2f} ms (min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f}) = "
          f"{a.batch / med:.0f} img/s, {flop / med * 1e-9:.1f} GFLOP/s")
    print(f"  cpu-time/threads: median {cmed * 1e3:.2f} ms = {a.batch / cmed:.0f} img/s, "
          f"{flop / cmed * 1e-9:.1f} GFLOP/s (uncontended estimate)")
    print(f"  {flop * 1e-9:.3f} GFLOP per step, peak RSS {rss:.0f} MB, loss {loss:.4f}, load {load:.2f}")
    print(f"RESULT workload={a.model} precision={a.precision} batch={a.batch} threads={a.threads} "
          f"median_s={med:.6f} min_s={min(ts):.6f} cpu_s={cmed:.6f} img_s={a.batch / med:.1f} "
          f"cpu_img_s={a.batch / cmed:.1f} gflop_step={flop * 1e-9:.4f} gflops={flop / med * 1e-9:.2f} "
          f"rss_mb={rss:.0f} load={load:.2f} memory_format={a.memory_format}")


if __name__ == "__main__":
    main()
