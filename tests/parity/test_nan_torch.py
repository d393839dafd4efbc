"""NaN and +-inf through every op, against PyTorch (issue 44): each op's
forward and backward on inputs with NaN, +inf and -inf planted among
ordinary values, on the devices in CTRAIN_OP_DEVICES (default "ref cpu";
the emulator's build runs it with "cuda"). Where PyTorch gives NaN, ctrain
must give NaN; where PyTorch gives +-inf, the same infinity; elsewhere
the same value (2e-5 relative). ReLU and max pooling used to turn NaN
into a finite value, so a diverged network still reported finite losses.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_dump  # noqa: E402 (exits 77 without torch or the tool)
from op_dump import out  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(44)
failures = []
checks = 0
DEVICE = "ref"


def run(tmp, op, ints, floats=(), **inputs):
    op_dump.run(tmp, op, ints, floats, device=DEVICE, **inputs)


def same(what, got, want, tol=2e-5):
    """NaN where PyTorch has NaN, the same infinities, close elsewhere."""
    global checks
    checks += 1
    what = f"{DEVICE}: {what}"
    want = want.detach().reshape(-1).to(torch.float32)
    if got.numel() != want.numel():
        failures.append(f"{what}: {got.numel()} elements, PyTorch has {want.numel()}")
        return
    gn, wn = torch.isnan(got), torch.isnan(want)
    if not torch.equal(gn, wn):
        i = (gn != wn).nonzero()[0].item()
        failures.append(f"{what}: element {i} is {got[i].item()}, PyTorch {want[i].item()} "
                        f"({int(wn.sum())} NaN in PyTorch, {int(gn.sum())} here)")
        return
    gi, wi = torch.isinf(got), torch.isinf(want)
    if not torch.equal(gi, wi) or not torch.equal(got[wi], want[wi]):
        i = ((gi != wi) | (gi & (got != want))).nonzero()[0].item()
        failures.append(f"{what}: element {i} is {got[i].item()}, PyTorch {want[i].item()}")
        return
    fin = ~(wn | wi)
    g, w = got[fin].double(), want[fin].double()
    err = ((g - w).abs() / w.abs().clamp(min=1.0)).max().item() if g.numel() else 0.0
    if not err <= tol:
        failures.append(f"{what}: max relative error {err:.3g} > {tol}")


def planted(*shape, scale=1.0, every=7):
    """Random values with NaN, +inf and -inf at spread positions."""
    x = torch.randn(*shape) * scale
    flat = x.view(-1)
    n = flat.numel()
    for k, v in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[(k * 5 + 3) % n :: every * 3] = v
    return x.requires_grad_(True)


def test_act(tmp):
    # kinds as ct_act (src/backend/backend.h)
    acts = ((1, "relu", F.relu, 0.0), (2, "leaky_relu", lambda x: F.leaky_relu(x, 0.1), 0.1), (3, "gelu", F.gelu, 0.0),
            (4, "silu", F.silu, 0.0), (5, "sigmoid", torch.sigmoid, 0.0), (6, "tanh", torch.tanh, 0.0))
    for kind, name, fn, alpha in acts:
        x = planted(64)
        dy = torch.randn(64)
        y = fn(x)
        y.backward(dy)
        run(tmp, "act", [64, kind], [alpha], x=x, dy=dy)
        same(f"{name} forward", out(tmp, "y"), y)
        same(f"{name} backward", out(tmp, "dx"), x.grad)


def test_maxpool(tmp):
    for (N, C, H, W, k, s, p) in ((2, 3, 8, 8, 2, 2, 0), (1, 2, 7, 7, 3, 2, 1)):
        x = planted(N, C, H, W, every=5)
        y = F.max_pool2d(x, k, s, p)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "maxpool", [N, C, H, W, k, k, s, s, p, p, 0, 0], x=x, dy=dy)
        same(f"maxpool {k}/{s}/{p} forward", out(tmp, "y"), y)
        # Where a window holds NaN PyTorch sends its gradient to the NaN.
        same(f"maxpool {k}/{s}/{p} backward", out(tmp, "dx"), x.grad)


def test_adaptive_max(tmp):
    x = planted(2, 3, 9, 7, every=5)
    y = F.adaptive_max_pool2d(x, (4, 3))
    dy = torch.randn_like(y)
    y.backward(dy)
    run(tmp, "adaptive_max", [2, 3, 9, 7, 4, 3], x=x, dy=dy)
    same("adaptive max forward", out(tmp, "y"), y)
    same("adaptive max backward", out(tmp, "dx"), x.grad)


def test_avgpool(tmp):
    x = planted(2, 3, 8, 8, every=11)
    y = F.avg_pool2d(x, 2, 2)
    dy = torch.randn_like(y)
    y.backward(dy)
    run(tmp, "avgpool", [2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 0, 1], x=x, dy=dy)
    same("avgpool forward", out(tmp, "y"), y)
    same("avgpool backward", out(tmp, "dx"), x.grad)


def test_softmax_losses(tmp):
    for log in (0, 1):
        x = planted(4, 10, every=13)
        dy = torch.randn(4, 10)
        y = F.log_softmax(x, 1) if log else F.softmax(x, 1)
        y.backward(dy)
        run(tmp, "softmax", [4, 10, log], x=x, dy=dy)
        same(f"{'log_' if log else ''}softmax forward", out(tmp, "y"), y)
        same(f"{'log_' if log else ''}softmax backward", out(tmp, "dx"), x.grad)
    # One row with NaN, one with +inf: the loss is NaN as in PyTorch.
    x = torch.randn(4, 10)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x.requires_grad_(True)
    t = torch.tensor([1, 2, 3, 4])
    loss = F.cross_entropy(x, t)
    loss.backward()
    run(tmp, "cross_entropy", [4, 10], [0.0, 1.0], x=x, target=t.float())
    same("cross_entropy loss", out(tmp, "loss"), loss.reshape(1))
    same("cross_entropy backward", out(tmp, "dx"), x.grad)


def test_batchnorm(tmp):
    N, C, S = 4, 3, 5
    x = torch.randn(N, C, S)
    x[1, 0, 2] = float("nan")
    x[2, 1, 1] = float("inf")
    x.requires_grad_(True)
    g, b = torch.rand(C) + 0.5, torch.randn(C)
    rm, rv = torch.zeros(C), torch.ones(C)
    dy = torch.randn(N, C, S)
    rm_t, rv_t = rm.clone(), rv.clone()
    y = F.batch_norm(x, rm_t, rv_t, g, b, True, 0.1, 1e-5)
    y.backward(dy)
    run(tmp, "batchnorm", [N, C, S, 1], [0.1, 1e-5], x=x, gamma=g, beta=b, rm=rm, rv=rv, dy=dy)
    same("batchnorm forward", out(tmp, "y"), y)
    same("batchnorm running mean", out(tmp, "rm"), rm_t)
    same("batchnorm backward", out(tmp, "dx"), x.grad)


def test_conv(tmp):
    x = planted(1, 2, 6, 6, every=17)
    w, b = torch.randn(3, 2, 3, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    y = F.conv2d(x, w, b, padding=1)
    dy = torch.randn_like(y)
    y.backward(dy)
    run(tmp, "conv", [1, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1], x=x, w=w, b=b, dy=dy)
    same("conv forward", out(tmp, "y"), y, tol=1e-4)
    same("conv backward data", out(tmp, "dx"), x.grad, tol=1e-4)
    # With the ReLU fused into the convolution: NaN must survive it as in
    # torch.relu. Not on cpu, whose oneDNN post-op ReLU is max(x, 0) in
    # its JIT code and turns NaN into 0 (a known departure, covered by
    # fit's weight check: docs/RELIABILITY.md); this asserts it still does,
    # so a oneDNN that changes is noticed.
    run(tmp, "conv", [1, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1], x=x, w=w, b=b, dy=dy)
    if DEVICE == "cpu":
        got, want = out(tmp, "y"), F.relu(y).detach().reshape(-1)
        nan = torch.isnan(want)
        same("conv + fused relu forward (non-NaN part)", got[~nan], want[~nan], tol=1e-4)
        if not bool((got[nan] == 0).all()):
            failures.append("cpu: conv + fused relu: oneDNN now keeps NaN; drop this departure from docs/RELIABILITY.md")
    else:
        same("conv + fused relu forward", out(tmp, "y"), F.relu(y), tol=1e-4)


devices = os.environ.get("CTRAIN_OP_DEVICES", "ref cpu").split()
with tempfile.TemporaryDirectory() as tmp:
    for DEVICE in devices:
        for t in (test_act, test_maxpool, test_adaptive_max, test_avgpool, test_softmax_losses, test_batchnorm, test_conv):
            t(tmp)
for f in failures:
    print("FAIL:", f)
print(f"{checks} checks on {', '.join(devices)}, {len(failures)} failed")
sys.exit(1 if failures else 0)
