#!/usr/bin/env python3
"""PyTorch side of bench/gpu/run_gpu.sh (NEVER RUN ON A GPU YET).

One workload per call, one machine-readable line on stdout:
  RESULT workload=... mode=... img_s=... peak_bytes=... [extra=...]
Models come from tests/parity/ctrain_models.py (the PyTorch twins of
ctrain's zoo; torchvision for alexnet/resnet50). Modes: fp32 (TF32 allowed
when --tf32), amp_fp16 (autocast + GradScaler), amp_bf16 (autocast); every
mode runs eager with channels_last + cudnn.benchmark, and --compile wraps the
model in torch.compile. Training step = forward, cross entropy, backward,
SGD momentum 0.9 step, on synthetic data resident on the GPU (the input
pipeline is not measured, as on the ctrain side).
"""
import argparse
import os
import sys
import time
import types

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
import ctrain_models  # noqa: E402


TORCHVISION_MODELS = ("alexnet", "vgg11_bn", "resnet18", "resnet50")


def need_torchvision(name):
    """ctrain_models.build imports torchvision for every model; the twins
    written out in ctrain_models.py do not use it, so on a machine without
    torchvision those rows still run (a stand-in module is registered)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if name in TORCHVISION_MODELS:
            print(f"torch_gpu.py: {name} needs torchvision, which is not installed", file=sys.stderr)
            sys.exit(1)
        sys.modules["torchvision"] = types.ModuleType("torchvision")


def grad_scaler(enabled):
    # torch.cuda.amp.GradScaler is deprecated from PyTorch 2.4 on.
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def train_speed(a):
    need_torchvision(a.model)
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    c, h, w = (int(v) for v in a.input.split("x"))
    model = ctrain_models.build(a.model, c, h, w, a.classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_model = torch.compile(model) if a.compile else model
    x = torch.randn(a.batch, c, h, w, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch,), device=dev)
    lossf = nn.CrossEntropyLoss()
    amp_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(a.mode)
    scaler = grad_scaler(a.mode == "amp_fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = lossf(step_model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"RESULT workload={a.model} mode={a.mode}{'_compile' if a.compile else ''} "
          f"img_s={a.batch * a.steps / dt:.1f} peak_bytes={torch.cuda.max_memory_allocated()}")


def matmul(a):
    """10000x200 @ 200x10000 (fp32) on the CPU and on the GPU."""
    res = {}
    for d in ("cpu", "cuda"):
        x = torch.randn(10000, 200, device=d)
        y = torch.randn(200, 10000, device=d)
        for _ in range(2):
            x @ y
        if d == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            x @ y
        if d == "cuda":
            torch.cuda.synchronize()
        res[d] = (time.perf_counter() - t0) / a.steps
    print(f"RESULT workload=matmul mode=fp32 cpu_s={res['cpu']:.6f} gpu_s={res['cuda']:.6f} img_s=0 peak_bytes=0")


def linreg(a):
    """1M points, nn.Linear + MSELoss + Adam, 500 steps, CPU and GPU."""
    res = {}
    for d in ("cpu", "cuda"):
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(1_000_000, 1, generator=g).to(d)
        y = 3 * x + 2 + 0.1 * torch.randn(1_000_000, 1, generator=g).to(d)
        m = nn.Linear(1, 1).to(d)
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        if d == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        if d == "cuda":
            torch.cuda.synchronize()
        res[d] = time.perf_counter() - t0
    print(f"RESULT workload=linreg mode=fp32 cpu_s={res['cpu']:.4f} gpu_s={res['cuda']:.4f} img_s=0 peak_bytes=0")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["train", "matmul", "linreg"])
    p.add_argument("--model", default="alexnet")
    p.add_argument("--input", default="3x227x227")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mode", default="fp32", choices=["fp32", "amp_fp16", "amp_bf16"])
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu.py: no CUDA device visible to PyTorch", file=sys.stderr)
        sys.exit(77)
    {"train": train_speed, "matmul": matmul, "linreg": linreg}[a.workload](a)


if __name__ == "__main__":
    main()
