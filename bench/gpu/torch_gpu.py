#!/usr/bin/env python3
"""PyTorch side of bench/gpu/run_gpu.sh (first run on an H100 on 2026-11-22:
bench/results/2026-11-22-h100-gpu.md; `maxbatch` has not run on a GPU yet).

One workload per call, one machine-readable line on stdout:
  RESULT workload=... mode=... img_s=... peak_bytes=... [extra=...]
Models come from tests/parity/ctrain_models.py (the PyTorch twins of
ctrain's zoo; torchvision for alexnet/resnet50). Modes: fp32 (TF32 allowed
when --tf32), amp_fp16 (autocast + GradScaler), amp_bf16 (autocast); every
mode runs eager with channels_last + cudnn.benchmark, and --compile wraps the
model in torch.compile. Training step = forward, cross entropy, backward,
SGD momentum 0.9 step, on synthetic data resident on the GPU (the input
pipeline is not measured, as on the ctrain side).

Activation recompute: `train --checkpoint-segments N` (N >= 2) runs the
model's sequential form (sequential_form below) through
torch.utils.checkpoint.checkpoint_sequential(seq, N, x,
use_reentrant=False), the counterpart of ctrain's --recompute N (run_gpu.sh
passes the count ctrain's --recompute auto chose); mode gets "_ckptN".
`maxbatch` finds the largest batch for which one training step runs
(doubling from --batch 64, then bisection down to --granularity of the
bound), with and without --checkpoint-segments:
  RESULT workload=... mode=...[_ckptN] max_batch=<B|0> peak_bytes=<at B>

`tta` (time to accuracy): ctrain's zoo `cnn` on Fashion-MNIST read from the
IDX .gz files of --data, ctrain's `train --model cnn --data fashion-mnist:DIR
--epochs 15 --batch-size 128 --optimizer adam --lr 0.001` recipe, and
  RESULT workload=cnn_fmnist_tta mode=fp32 tta_s=<s|-> epoch=<n> acc=<a> ...
where tta_s is the summed training seconds of the epochs up to the first
with test accuracy >= --target (0.91), "-" when not reached; epoch is that
epoch (or the number run) and acc the test accuracy there (or the best).

--device cpu runs every workload on the CPU (matmul and linreg then time
the CPU twice): bench/gpu/rehearse.sh uses it to run run_gpu.sh end to end
without a GPU. Peak memory is 0 there.
"""
import argparse
import contextlib
import gzip
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


class Device:
    """Where a workload runs: synchronisation and peak-memory statistics
    exist on cuda only (no-ops and 0 on the cpu)."""

    def __init__(self, name):
        self.dev = torch.device(name)
        self.cuda = self.dev.type == "cuda"
        self.cpu_ok = {}  # cpu_autocasts' answers per dtype

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak(self):
        return torch.cuda.max_memory_allocated() if self.cuda else 0

    def empty_cache(self):
        if self.cuda:
            torch.cuda.empty_cache()

    def autocast(self, amp_dtype):
        if amp_dtype is not None and not self.cuda and not self.cpu_autocasts(amp_dtype):
            amp_dtype = None
        return torch.autocast(self.dev.type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()

    def cpu_autocasts(self, amp_dtype):
        """PyTorch 1.x autocasts to bf16 only on the cpu: a rehearsal's
        fp16 rows then run in fp32 (said once on stderr)."""
        if amp_dtype not in self.cpu_ok:
            try:
                with torch.autocast("cpu", dtype=amp_dtype):
                    pass
                self.cpu_ok[amp_dtype] = True
            except RuntimeError as e:
                print(f"torch_gpu.py: {e}; fp32 instead", file=sys.stderr)
                self.cpu_ok[amp_dtype] = False
        return self.cpu_ok[amp_dtype]

    def grad_scaler(self, enabled):
        # torch.cuda.amp.GradScaler is deprecated from PyTorch 2.4 on;
        # PyTorch 1.x has no cpu scaler (there it is off: bf16 and fp32
        # need none, and a rehearsal's fp16 autocast on the cpu is too).
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
            return torch.amp.GradScaler(self.dev.type, enabled=enabled)
        return torch.cuda.amp.GradScaler(enabled=enabled and self.cuda)


def sequential_form(model):
    """The model as one nn.Sequential of its top-level stages, the input of
    checkpoint_sequential: torchvision's ResNet as stem, bottleneck/basic
    blocks one by one, pool, flatten, fc; AlexNet/VGG as features, pool,
    flatten, classifier; an nn.Sequential as it is. The modules are the
    model's own (same parameters). A top-level in-place ReLU could start a
    segment and overwrite the input checkpoint saved for it, so those get
    inplace=False (block-internal ReLUs stay in place)."""
    if isinstance(model, nn.Sequential):
        seq = model
    elif all(hasattr(model, k) for k in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer4", "avgpool", "fc")):
        seq = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool, *model.layer1, *model.layer2,
                            *model.layer3, *model.layer4, model.avgpool, nn.Flatten(1), model.fc)
    elif all(hasattr(model, k) for k in ("features", "avgpool", "classifier")):
        seq = nn.Sequential(*model.features, model.avgpool, nn.Flatten(1), *model.classifier)
    else:
        raise ValueError(f"no sequential form for {type(model).__name__}")
    for child in seq.children():
        if isinstance(child, nn.ReLU):
            child.inplace = False
    return seq


def checkpointed(seq, segments):
    """forward(x) = checkpoint_sequential(seq, segments, x) without
    re-entrant autograd (the input needs no requires_grad and the
    parameters of every segment get gradients). PyTorch before 2.0 has no
    use_reentrant argument there: the same loop over
    torch.utils.checkpoint.checkpoint, which has."""
    import inspect
    import torch.utils.checkpoint as cp
    if "use_reentrant" in inspect.signature(cp.checkpoint_sequential).parameters:
        return lambda x: cp.checkpoint_sequential(seq, segments, x, use_reentrant=False)
    mods = list(seq.children())

    def run(start, end):
        def f(x):
            for j in range(start, end + 1):
                x = mods[j](x)
            return x
        return f

    def forward(x):
        size = len(mods) // segments
        end = -1
        for start in range(0, size * (segments - 1), size):
            end = start + size - 1
            x = cp.checkpoint(run(start, end), x, use_reentrant=False)
        return run(end + 1, len(mods) - 1)(x)
    return forward


def mode_name(a):
    ck = f"_ckpt{a.checkpoint_segments}" if a.checkpoint_segments >= 2 else ""
    return f"{a.mode}{ck}{'_compile' if a.compile else ''}"


def train_speed(a):
    need_torchvision(a.model)
    d = Device(a.device)
    dev = d.dev
    # --deterministic: what PyTorch's reproducibility notes ask for,
    # against ctrain --deterministic (run_gpu.sh's determinism group)
    torch.backends.cudnn.benchmark = not a.deterministic
    torch.backends.cudnn.deterministic = a.deterministic
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    c, h, w = (int(v) for v in a.input.split("x"))
    model = ctrain_models.build(a.model, c, h, w, a.classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_model = checkpointed(sequential_form(model), a.checkpoint_segments) if a.checkpoint_segments >= 2 else model
    if a.compile:
        step_model = torch.compile(step_model)
    x = torch.randn(a.batch, c, h, w, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch,), device=dev)
    lossf = nn.CrossEntropyLoss()
    amp_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(a.mode)
    scaler = d.grad_scaler(a.mode == "amp_fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with d.autocast(amp_dtype):
            loss = lossf(step_model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(a.warmup):
        step()
    d.sync()
    d.reset_peak()
    if a.profiler_range and d.cuda:
        torch.cuda.profiler.start()  # cudaProfilerStart: ncu --profile-from-start off records from here
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    d.sync()
    dt = time.perf_counter() - t0
    if a.profiler_range and d.cuda:
        torch.cuda.profiler.stop()
    print(f"RESULT workload={a.model} mode={mode_name(a)} "
          f"img_s={a.batch * a.steps / dt:.1f} peak_bytes={d.peak()}")
    if a.profile > 0:
        print_profile(a, d, step)


def print_profile(a, d, step):
    """torch.profiler over --profile more steps: the ops sorted by their
    own device time (cpu time on the cpu), 30 rows. PyTorch 2.x calls the
    column self_device_time_total, earlier ones self_cuda_time_total."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if d.cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(a.profile):
            step()
        d.sync()
    avg = prof.key_averages()
    keys = (["self_device_time_total", "self_cuda_time_total"] if d.cuda else []) + ["self_cpu_time_total"]
    for key in keys:
        try:
            table = avg.table(sort_by=key, row_limit=30)
        except (AttributeError, KeyError, ValueError):
            continue
        print(f"profile of {a.model} {mode_name(a)} batch {a.batch}, {a.profile} steps, sorted by {key}:")
        print(table)
        return
    print("torch_gpu.py: the profiler table could not be sorted by " + ", ".join(keys), file=sys.stderr)


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e)


def max_batch(a):
    """Largest batch (a multiple of 8 past the doubling) for which one
    training step of train_speed's kind runs on the GPU. cudnn.benchmark
    stays off: a timing run per new batch shape would dominate, and the
    question is what fits. Every failed try is cleaned up (gradients, the
    allocator's cache) before the next."""
    import gc
    need_torchvision(a.model)
    d = Device(a.device)
    dev = d.dev
    torch.backends.cudnn.benchmark = False
    c, h, w = (int(v) for v in a.input.split("x"))
    model = ctrain_models.build(a.model, c, h, w, a.classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fwd = checkpointed(sequential_form(model), a.checkpoint_segments) if a.checkpoint_segments >= 2 else model
    lossf = nn.CrossEntropyLoss()
    amp_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(a.mode)
    scaler = d.grad_scaler(a.mode == "amp_fp16")

    def fits(b):
        ok, why = False, "out of memory"
        d.reset_peak()
        try:
            x = torch.randn(b, c, h, w, device=dev).to(memory_format=torch.channels_last)
            y = torch.randint(0, a.classes, (b,), device=dev)
            opt.zero_grad(set_to_none=True)
            with d.autocast(amp_dtype):
                loss = lossf(fwd(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            d.sync()
            ok = True
        except RuntimeError as e:
            # Not only out of memory: a library may refuse a tensor past
            # its 32-bit index range at large batches; that does not run
            # either, so it ends the search the same way (reason logged).
            if not is_oom(e):
                why = f"failed: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}"
        # Outside the except block: its traceback holds the failed step's
        # frames (and their tensors) until the block ends.
        peak = d.peak()
        x = y = loss = None
        opt.zero_grad(set_to_none=True)
        gc.collect()
        d.empty_cache()
        print(f"maxbatch {a.model} {mode_name(a)}: batch {b} {'fits' if ok else why}, "
              f"peak {peak / 2**20:.0f} MiB", file=sys.stderr, flush=True)
        return ok, peak

    lo, lo_peak, hi, b = 0, 0, 0, a.batch
    while b <= a.max_batch_cap:
        ok, peak = fits(b)
        if not ok:
            hi = b
            break
        lo, lo_peak, b = b, peak, b * 2
    while lo and hi and hi - lo > max(8, int(lo * a.granularity)):
        mid = (lo + hi) // 2 // 8 * 8
        if mid <= lo:
            break
        ok, peak = fits(mid)
        if ok:
            lo, lo_peak = mid, peak
        else:
            hi = mid
    print(f"RESULT workload={a.model} mode={mode_name(a)} max_batch={lo} peak_bytes={lo_peak} "
          f"first_oom={hi or '-'} img_s=0")


def matmul(a):
    """--shape MxKxN (10000x200x10000), fp32, on the CPU and on --device."""
    m, k, n = (int(v) for v in a.shape.split("x"))
    res = []
    for name in ("cpu", a.device):
        d = Device(name)
        x = torch.randn(m, k, device=d.dev)
        y = torch.randn(k, n, device=d.dev)
        for _ in range(2):
            x @ y
        d.sync()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            x @ y
        d.sync()
        res.append((time.perf_counter() - t0) / a.steps)
    print(f"RESULT workload=matmul mode=fp32 cpu_s={res[0]:.6f} gpu_s={res[1]:.6f} img_s=0 peak_bytes=0")


def linreg(a):
    """--points (1M) points, nn.Linear + MSELoss + Adam, --iters (500)
    steps, on the CPU and on --device."""
    res = []
    for name in ("cpu", a.device):
        d = Device(name)
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(a.points, 1, generator=g).to(d.dev)
        y = 3 * x + 2 + 0.1 * torch.randn(a.points, 1, generator=g).to(d.dev)
        m = nn.Linear(1, 1).to(d.dev)
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        d.sync()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        d.sync()
        res.append(time.perf_counter() - t0)
    print(f"RESULT workload=linreg mode=fp32 cpu_s={res[0]:.4f} gpu_s={res[1]:.4f} img_s=0 peak_bytes=0")


def read_idx_gz(path, magic):
    """One IDX file (.gz or plain, as ctrain's idx.c accepts): big-endian
    u32 magic, u32 dims, then uint8 data. A uint8 CPU tensor; no numpy,
    which PyTorch 2.x wheels do not pull in."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    m = int.from_bytes(raw[0:4], "big")
    if m != magic:
        raise ValueError(f"{path}: magic {m}, expected {magic}")
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    count = 1
    for v in dims:
        count *= v
    if len(raw) - (4 + 4 * nd) != count:
        raise ValueError(f"{path}: {len(raw) - (4 + 4 * nd)} bytes of data, header says {dims}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8, offset=4 + 4 * nd).reshape(dims)


def load_fmnist(d, split):
    """Split "train" or "t10k" of the IDX files in d as (uint8 N x 28 x 28,
    int64 N); the .gz file first, then the plain one, like ctrain."""
    def find(kind):
        for z in (".gz", ""):
            p = os.path.join(d, f"{split}-{kind}{z}")
            if os.path.exists(p):
                return p
        raise FileNotFoundError(f"{d}: no {split}-{kind}[.gz]")
    x = read_idx_gz(find("images-idx3-ubyte"), 2051)
    y = read_idx_gz(find("labels-idx1-ubyte"), 2049)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{d}: {x.shape[0]} {split} images but {y.shape[0]} labels")
    return x, y.long()


def tta(a):
    """Time to --target test accuracy for ctrain's zoo cnn on Fashion-MNIST."""
    d = Device(a.device)
    dev = d.dev
    if d.cuda:
        # Strict fp32 as ctrain's fp32 row (ctrain uses TF32 only under
        # CTRAIN_CUDA_TF32=1; PyTorch 2.x allows it in cuDNN convs by
        # default). cudnn.benchmark stays at PyTorch's default (off), as
        # ctrain's run has no --cudnn-benchmark.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)
    # ctrain's fashion-mnist loader: ToFloat (/255) and nothing else (no
    # mean/std normalisation; ct_transform_default, src/cli/setup.c sets no
    # normalize), 1x28x28, labels 0..9. The whole of both splits is put
    # on the device once, as float: the fair equivalent of a loader that
    # never makes the GPU wait (ctrain's side uses its host loader).
    def to_dev(split):
        x, y = load_fmnist(a.data, split)
        xt = x.to(dev).float().div_(255.0).unsqueeze(1)
        return xt.contiguous(), y.to(dev)
    try:
        xtr, ytr = to_dev("train")
        xte, yte = to_dev("t10k")
    except (OSError, ValueError) as e:
        print(f"torch_gpu.py tta: {e} (give the Fashion-MNIST IDX folder as --data DIR)", file=sys.stderr)
        sys.exit(1)
    # The PyTorch twin of src/nn/models/zoo.c's build_cnn (same layers and
    # PyTorch's default init, which ctrain's init.c reproduces).
    model = ctrain_models.CnnModel(1, 10).to(dev)
    params = sum(p.numel() for p in model.parameters())
    # ctrain's Adam defaults = torch.optim.Adam's: betas (0.9, 0.999),
    # eps 1e-8, weight_decay 0, no amsgrad (src/optim/optimizer.c).
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    lossf = nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    n, b = xtr.shape[0], a.batch
    print(f"tta: cnn ({params} parameters) on Fashion-MNIST {a.data}: {n} train / {xte.shape[0]} test images, "
          f"/255 only, batch {b} (last partial batch kept, as ctrain), Adam lr {a.lr}, up to {a.epochs} epochs, "
          f"device {dev}; data resident on the device as tensors (a loader that costs nothing)", flush=True)

    def evaluate():
        model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=dev)
        with torch.no_grad():
            for i in range(0, xte.shape[0], 1000):
                correct += (model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum()
        return correct.item() / xte.shape[0]

    total = 0.0
    hit = None
    best = (0.0, 0)
    d.reset_peak()
    for ep in range(1, a.epochs + 1):
        # Shuffled order before the clock starts, as ctrain builds its
        # epoch order in ct_loader_start_epoch before taking t0.
        perm = torch.randperm(n, generator=gen, device=dev)
        model.train()
        loss_sum = torch.zeros((), device=dev)
        correct = torch.zeros((), dtype=torch.int64, device=dev)
        d.sync()
        # The same span as ctrain's history.csv `seconds` (src/train/
        # trainer.c, fit): the epoch's training steps only, from the first
        # batch until the last step has finished (ctrain drains its device
        # queue before stopping the clock); evaluation on the test split,
        # history and checkpoint writing are outside it. Loss and accuracy
        # are summed on the device so no step waits for a read-back.
        t0 = time.perf_counter()
        for i in range(0, n, b):
            idx = perm[i:i + b]
            x, y = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = lossf(out, y)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * y.shape[0]
            correct += (out.detach().argmax(1) == y).sum()
        d.sync()
        dt = time.perf_counter() - t0
        total += dt
        acc = evaluate()
        if acc > best[0]:
            best = (acc, ep)
        print(f"epoch {ep}: loss {loss_sum.item() / n:.4f} accuracy {correct.item() / n:.4f} "
              f"test_accuracy {acc:.4f} seconds {dt:.2f} cumulative {total:.2f}", flush=True)
        if acc >= a.target:
            hit = (total, ep, acc)
            break
    peak = d.peak()
    if hit:
        print(f"RESULT workload=cnn_fmnist_tta mode=fp32 device={dev.type} tta_s={hit[0]:.2f} epoch={hit[1]} "
              f"acc={hit[2]:.4f} target={a.target} params={params} peak_bytes={peak}")
    else:
        print(f"RESULT workload=cnn_fmnist_tta mode=fp32 device={dev.type} tta_s=- epoch={ep} acc={best[0]:.4f} "
              f"best_epoch={best[1]} target={a.target} params={params} train_s={total:.2f} peak_bytes={peak}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["train", "matmul", "linreg", "tta", "maxbatch"])
    p.add_argument("--model", default="alexnet")
    p.add_argument("--input", default="3x227x227")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", "--batch-size", type=int, default=None,
                   help="batch size (train: 256, tta: 128)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mode", default="fp32", choices=["fp32", "amp_fp16", "amp_bf16"])
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--deterministic", action="store_true",
                   help="train: cudnn.deterministic = True and cudnn.benchmark = False")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="train: after the timing, torch.profiler over N more steps (op table on stdout)")
    p.add_argument("--profiler-range", action="store_true",
                   help="train: bracket the timed steps with cudaProfilerStart/Stop (ncu_table.py)")
    p.add_argument("--checkpoint-segments", type=int, default=0,
                   help="train/maxbatch: checkpoint_sequential with N >= 2 segments (0: off)")
    p.add_argument("--granularity", type=float, default=1 / 16,
                   help="maxbatch: stop bisecting when the bracket is below this share of the batch")
    p.add_argument("--max-batch-cap", type=int, default=1 << 16, help="maxbatch: largest batch tried")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: every workload on the CPU, for bench/gpu/rehearse.sh")
    p.add_argument("--shape", default="10000x200x10000", help="matmul: MxKxN")
    p.add_argument("--points", type=int, default=1_000_000, help="linreg: data points")
    p.add_argument("--iters", type=int, default=500, help="linreg: Adam steps")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="tta: folder of the IDX files")
    p.add_argument("--epochs", type=int, default=15, help="tta")
    p.add_argument("--seed", type=int, default=0, help="tta")
    p.add_argument("--lr", type=float, default=1e-3, help="tta: Adam learning rate")
    p.add_argument("--target", type=float, default=0.91, help="tta: test accuracy to reach")
    a = p.parse_args()
    if a.batch is None:
        a.batch = {"tta": 128, "maxbatch": 64}.get(a.workload, 256)
    if a.workload == "tta" and a.epochs < 1:
        p.error("--epochs must be >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpu.py: no CUDA device visible to PyTorch", file=sys.stderr)
        sys.exit(77)
    {"train": train_speed, "matmul": matmul, "linreg": linreg, "tta": tta, "maxbatch": max_batch}[a.workload](a)


if __name__ == "__main__":
    main()
