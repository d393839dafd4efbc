#!/usr/bin/python3
"""PyTorch (CPU) side of bench/recompute.sh: a training step with and
without torch.utils.checkpoint.checkpoint_sequential.

  recompute_torch.py --model alexnet|resnet18|resnet50 [--batch 32]
                     [--input CxHxW] [--classes 10] [--steps 5] [--warmup 1]
                     [--threads 2] [--segments 0|N]
                     [--impl nonreentrant|sequential] [--check]

The model is torchvision's (num_classes = --classes, as ctrain's zoo model
built by bench_train with its default --classes 10), run in its sequential
form so checkpoint_sequential can split it:
  alexnet:  features[0..12], avgpool, Flatten, classifier[0..6]   (22 modules)
  resnet*:  conv1, bn1, relu, maxpool, every block of layer1..layer4,
            avgpool, Flatten, fc            (resnet18: 15, resnet50: 23)
These are the modules the torchvision forward() calls, in its order, so the
plain step (--segments 0) is the model's own step.

Step: forward, nn.CrossEntropyLoss, zero_grad, backward, torch.optim.SGD
(lr 0.01, no momentum: no optimizer state, like bench_train --optim sgd).
--segments N >= 2 checkpoints the model the way checkpoint_sequential(seq,
N, x) does: len // N modules per segment, the remainder in the last one,
which is not checkpointed; every other segment runs without keeping its
inner activations and runs again before its backward. PyTorch 1.13's
checkpoint_sequential has no use_reentrant argument (it always uses the
reentrant checkpoint), so the default --impl nonreentrant makes that same
split with checkpoint(..., use_reentrant=False), which 1.13's checkpoint
accepts. --impl sequential calls checkpoint_sequential itself: the
reentrant checkpoint back-propagates into a segment only when its input
requires grad, so x.requires_grad_(True) (one extra input gradient of the
first layer per step), and it refuses an in-place module at the start of a
segment ("a leaf Variable that requires grad is being used in an in-place
operation": AlexNet's ReLU(inplace=True)), so those get inplace=False.
--check compares the parameter gradients of one plain and one checkpointed
step from the same weights and input, and exits 1 when they differ by more
than 1e-4 relative.

Prints the median step wall time as images/s, CPU time / threads, and peak
RSS (ru_maxrss of the whole process, interpreter and libraries included)
and the RSS just before the first step (VmRSS). Last line:
"RESULT key=value ..." for bench/recompute.sh.
"""
import argparse
import sys

import torch
import torchvision
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from torch_timing import load1, peak_rss_mb, time_steps


def sequential_form(name, model):
    """The model's forward as a flat nn.Sequential of its modules."""
    if name == "alexnet":
        mods = list(model.features) + [model.avgpool, nn.Flatten(1)] + list(model.classifier)
    else:
        mods = [model.conv1, model.bn1, model.relu, model.maxpool]
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            mods += list(layer)
        mods += [model.avgpool, nn.Flatten(1), model.fc]
    return nn.Sequential(*mods)


def checkpoint_nonreentrant(mods, segments, x):
    """checkpoint_sequential's split (len // segments modules per segment,
    the remainder in the last, which is not checkpointed) with the
    non-reentrant checkpoint of PyTorch 1.13."""
    mods = list(mods)
    size = len(mods) // segments

    def run(a, b):
        def f(t):
            for j in range(a, b + 1):
                t = mods[j](t)
            return t
        return f

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        x = checkpoint(run(start, end), x, use_reentrant=False)
    return run(end + 1, len(mods) - 1)(x)


def module_macs(seq, x):
    """Forward conv/linear multiply-adds of each module of seq for input x."""
    out, cur = [0] * len(seq), [0]

    def hook(mod, inp, o):
        if isinstance(mod, nn.Conv2d):
            out[cur[0]] += o.numel() * mod.kernel_size[0] * mod.kernel_size[1] * (mod.in_channels // mod.groups)
        elif isinstance(mod, nn.Linear):
            out[cur[0]] += o.numel() * mod.in_features

    hs = [m.register_forward_hook(hook) for m in seq.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        seq.eval()
        for i, mod in enumerate(seq):
            cur[0] = i
            x = mod(x)
        seq.train()
    for h in hs:
        h.remove()
    return out


def vmrss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18", choices=["alexnet", "resnet18", "resnet50"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input", default=None)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--segments", type=int, default=0)
    p.add_argument("--impl", default="nonreentrant", choices=["nonreentrant", "sequential"])
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    defaults = {"alexnet": (3, 227, 227), "resnet18": (3, 32, 32), "resnet50": (3, 224, 224)}
    c, h, w = defaults[a.model]
    if a.input:
        c, h, w = (int(v) for v in a.input.split("x"))
    torch.manual_seed(1)
    model = getattr(torchvision.models, a.model)(num_classes=a.classes)
    seq = sequential_form(a.model, model)
    seq.train()
    x = torch.rand(a.batch, c, h, w) * 2 - 1
    y = torch.randint(0, a.classes, (a.batch,))
    ckpt = a.segments >= 2
    macs = module_macs(seq, x[:1].detach())
    flop = 3.0 * 2.0 * sum(macs) * a.batch
    # checkpointed modules: all but the last segment's, as checkpoint_sequential splits
    n_ck = (len(seq) // a.segments) * (a.segments - 1) if ckpt else 0
    rc_flop = 2.0 * sum(macs[:n_ck]) * a.batch
    if ckpt and a.impl == "sequential":
        x.requires_grad_(True)
        size = len(seq) // a.segments
        for start in range(0, size * (a.segments - 1) + 1, size):
            if hasattr(seq[start], "inplace"):
                seq[start].inplace = False
    opt = torch.optim.SGD(seq.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def forward(use_ckpt):
        if not use_ckpt:
            return seq(x)
        if a.impl == "sequential":
            return checkpoint_sequential(seq, a.segments, x)
        return checkpoint_nonreentrant(seq, a.segments, x)

    def step():
        loss = loss_fn(forward(ckpt), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss)

    if a.check:
        if not ckpt:
            sys.exit("--check needs --segments >= 2")
        grads = []
        state = {k: v.clone() for k, v in seq.state_dict().items()}
        for use in (False, True):
            seq.load_state_dict(state)
            torch.manual_seed(5)  # same dropout masks in both passes
            seq.zero_grad()
            loss_fn(forward(use), y).backward()
            grads.append([p.grad.clone() for p in seq.parameters()])
        worst = max(float((g1 - g0).abs().max() / (g0.abs().max() + 1e-12)) for g0, g1 in zip(*grads))
        print(f"check: {len(grads[0])} parameter gradients, worst max|diff|/max|plain| = {worst:.2e}")
        seq.load_state_dict(state)
        if not worst < 1e-4:
            sys.exit(1)

    rss0 = vmrss_mb()
    ts, med, cmed, loss = time_steps(step, a.warmup, a.steps, a.threads)
    rss, load = peak_rss_mb(), load1()
    mode = f"checkpoint_sequential {a.segments} segments ({a.impl})" if ckpt else "plain"
    print(f"torch {torch.__version__} {a.model} fp32 train step (sgd, {mode}), batch {a.batch}, input {c}x{h}x{w}, "
          f"{len(seq)} modules, {a.threads} threads, median of {a.steps} after {a.warmup} warm-up:")
    print(f"  wall: median {med * 1e3:.2f} ms (min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f}) = {a.batch / med:.1f} img/s")
    print(f"  cpu-time/threads: median {cmed * 1e3:.2f} ms = {a.batch / cmed:.1f} img/s (uncontended estimate)")
    print(f"  {flop * 1e-9:.3f} GFLOP per step; recompute {n_ck} of {len(seq)} modules forward twice "
          f"(+{rc_flop * 1e-9:.3f} GFLOP, +{100 * rc_flop / flop:.1f}%)")
    print(f"  peak RSS {rss:.0f} MB (before the first step {rss0:.0f} MB), loss {loss:.4f}, load {load:.2f}")
    print(f"RESULT workload={a.model} batch={a.batch} threads={a.threads} segments={a.segments if ckpt else 1} "
          f"impl={a.impl if ckpt else 'plain'} modules={len(seq)} median_s={med:.6f} min_s={min(ts):.6f} cpu_s={cmed:.6f} "
          f"img_s={a.batch / med:.1f} cpu_img_s={a.batch / cmed:.1f} rss_mb={rss:.0f} rss0_mb={rss0:.0f} load={load:.2f} gflop_step={flop * 1e-9:.4f} rc_gflop={rc_flop * 1e-9:.4f}")


if __name__ == "__main__":
    main()
