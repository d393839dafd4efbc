"""Reference backend vs PyTorch: op semantics that finite differences
cannot see (pool windows with ceil_mode and padding, count_include_pad,
adaptive bins, argmax indices, BatchNorm running statistics, label
smoothing, exact GELU, softmax). Runs each op in f32 through
tests/tools/ref_op_dump on random inputs and compares outputs and input
gradients with torch.nn.functional (autograd for the backward)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from op_dump import out, run  # noqa: E402 (exits 77 without torch or the tool)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(1234)
failures = []
checks = 0


def close(what, got, want, tol=2e-5):
    global checks
    checks += 1
    want = want.detach().reshape(-1).to(got.dtype)
    if got.numel() != want.numel():
        failures.append(f"{what}: {got.numel()} elements, PyTorch has {want.numel()}")
        return
    if got.dtype in (torch.int32, torch.int64):
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].item()
            failures.append(f"{what}: element {bad} is {got[bad].item()}, PyTorch {want[bad].item()}")
        return
    err = ((got.double() - want.double()).abs() / want.double().abs().clamp(min=1.0)).max().item()
    if not err <= tol:
        failures.append(f"{what}: max relative error {err:.3g} > {tol}")


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


def test_conv(tmp):
    cases = [  # N C H W O KH KW sh sw ph pw dh dw groups
        (2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
        (2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 2, 1, 2),
        (1, 3, 6, 7, 3, 3, 3, 2, 2, 1, 1, 1, 1, 3),
    ]
    for c in cases:
        N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, g = c
        x, w, b = leaf(N, C, H, W), leaf(O, C // g, KH, KW, scale=0.5), leaf(O)
        y = F.conv2d(x, w, b, stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw), groups=g)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "conv", c, x=x, w=w, b=b, dy=dy)
        close(f"conv{c} y", out(tmp, "y"), y)
        close(f"conv{c} dx", out(tmp, "dx"), x.grad)
        close(f"conv{c} dw", out(tmp, "dw"), w.grad)
        close(f"conv{c} db", out(tmp, "db"), b.grad)


def test_pools(tmp):
    cases = [  # N C H W kh kw sh sw ph pw ceil
        (2, 2, 7, 7, 3, 3, 2, 2, 1, 1, 0),
        (2, 2, 6, 6, 3, 3, 2, 2, 1, 1, 1),
        (1, 3, 5, 6, 2, 2, 2, 2, 0, 0, 1),
        (1, 2, 5, 5, 3, 3, 3, 3, 1, 1, 1),  # ceil_mode's last window dropped
        (2, 1, 8, 10, 3, 4, 3, 3, 1, 2, 1),
        (1, 2, 10, 9, 4, 3, 3, 2, 2, 1, 1),
    ]
    for c in cases:
        N, C, H, W, kh, kw, sh, sw, ph, pw, ceil = c
        x = leaf(N, C, H, W)
        y, idx = F.max_pool2d(x, (kh, kw), (sh, sw), (ph, pw), ceil_mode=bool(ceil), return_indices=True)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "maxpool", list(c) + [1], x=x, dy=dy)
        close(f"maxpool{c} y", out(tmp, "y"), y)
        close(f"maxpool{c} idx", out(tmp, "idx", "i32"), idx.to(torch.int32))
        close(f"maxpool{c} dx", out(tmp, "dx"), x.grad)
        for cip in (0, 1):
            x = leaf(N, C, H, W)
            y = F.avg_pool2d(x, (kh, kw), (sh, sw), (ph, pw), ceil_mode=bool(ceil), count_include_pad=bool(cip))
            dy = torch.randn_like(y)
            y.backward(dy)
            run(tmp, "avgpool", list(c) + [cip], x=x, dy=dy)
            close(f"avgpool{c} cip={cip} y", out(tmp, "y"), y)
            close(f"avgpool{c} cip={cip} dx", out(tmp, "dx"), x.grad)
    for (N, C, H, W, OH, OW) in [(2, 2, 5, 7, 3, 2), (1, 3, 7, 5, 2, 3), (1, 2, 3, 4, 5, 6), (2, 1, 9, 9, 4, 4)]:
        x = leaf(N, C, H, W)
        y = F.adaptive_avg_pool2d(x, (OH, OW))
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "adaptive_avg", (N, C, H, W, OH, OW), x=x, dy=dy)
        close(f"adaptive_avg {H}x{W}->{OH}x{OW} y", out(tmp, "y"), y)
        close(f"adaptive_avg {H}x{W}->{OH}x{OW} dx", out(tmp, "dx"), x.grad)
        x = leaf(N, C, H, W)
        y, idx = F.adaptive_max_pool2d(x, (OH, OW), return_indices=True)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "adaptive_max", (N, C, H, W, OH, OW), x=x, dy=dy)
        close(f"adaptive_max {H}x{W}->{OH}x{OW} y", out(tmp, "y"), y)
        close(f"adaptive_max {H}x{W}->{OH}x{OW} idx", out(tmp, "idx", "i32"), idx.to(torch.int32))
        close(f"adaptive_max {H}x{W}->{OH}x{OW} dx", out(tmp, "dx"), x.grad)


def test_batchnorm(tmp):
    for (N, C, S) in [(8, 3, 1), (4, 2, 6), (3, 4, 12)]:
        for training in (1, 0):
            x = (torch.randn(N, C, S) * 2 + 0.5).requires_grad_(True)
            g, b = leaf(C), leaf(C)
            rm, rv = torch.randn(C), torch.rand(C) + 0.5
            rm_t, rv_t = rm.clone(), rv.clone()
            y = F.batch_norm(x, rm_t, rv_t, g, b, training=bool(training), momentum=0.1, eps=1e-5)
            dy = torch.randn_like(y)
            y.backward(dy)
            run(tmp, "batchnorm", (N, C, S, training), (0.1, 1e-5), x=x, gamma=g, beta=b, rm=rm, rv=rv, dy=dy)
            tag = f"batchnorm [{N},{C},{S}] training={training}"
            close(tag + " y", out(tmp, "y"), y, 5e-5)
            close(tag + " running_mean", out(tmp, "rm"), rm_t)
            close(tag + " running_var", out(tmp, "rv"), rv_t)
            if training:
                close(tag + " dx", out(tmp, "dx"), x.grad, 5e-5)
                close(tag + " dgamma", out(tmp, "dgamma"), g.grad, 5e-5)
                close(tag + " dbeta", out(tmp, "dbeta"), b.grad)


def test_losses(tmp):
    N, C = 7, 5
    for ls in (0.0, 0.1, 0.3):
        x = leaf(N, C, scale=2.0)
        t = torch.randint(0, C, (N,))
        loss = F.cross_entropy(x, t, label_smoothing=ls)
        (loss * 3.0).backward()
        run(tmp, "cross_entropy", (N, C), (ls, 3.0), x=x, target=t.float())
        close(f"cross_entropy ls={ls} loss", out(tmp, "loss"), loss)
        close(f"cross_entropy ls={ls} dx", out(tmp, "dx"), x.grad)
    x = leaf(N, C)
    t = torch.randint(0, C, (N,))
    loss = F.nll_loss(x, t)
    (loss * 2.0).backward()
    run(tmp, "nll", (N, C), (0.0, 2.0), x=x, target=t.float())
    close("nll loss", out(tmp, "loss"), loss)
    close("nll dx", out(tmp, "dx"), x.grad)


def test_elementwise(tmp):
    acts = {1: F.relu, 2: lambda v: F.leaky_relu(v, 0.2), 3: F.gelu, 4: F.silu, 5: torch.sigmoid, 6: torch.tanh}
    for kind, fn in acts.items():
        x = leaf(64, scale=2.0)
        y = fn(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "act", (64, kind), (0.2,), x=x, dy=dy)
        close(f"act {kind} y", out(tmp, "y"), y)
        close(f"act {kind} dx", out(tmp, "dx"), x.grad)
    for log in (0, 1):
        x = leaf(4, 9, scale=3.0)
        y = F.log_softmax(x, 1) if log else F.softmax(x, 1)
        dy = torch.randn_like(y)
        y.backward(dy)
        run(tmp, "softmax", (4, 9, log), x=x, dy=dy)
        close(f"softmax log={log} y", out(tmp, "y"), y)
        close(f"softmax log={log} dx", out(tmp, "dx"), x.grad)
    # Dropout masks come from ctrain's counter RNG, not torch's: check the
    # scaling and that forward and backward use the same mask.
    x = torch.randn(4000) + 3.0
    dy = torch.randn(4000)
    run(tmp, "dropout", (4000, 1, 99, 2, 5), (0.25,), x=x, dy=dy)
    y, dx = out(tmp, "y"), out(tmp, "dx")
    kept = y != 0
    close("dropout kept scale", y[kept], x[kept] / 0.75)
    close("dropout bwd mask", dx[kept], dy[kept] / 0.75)
    close("dropout bwd dropped", dx[~kept], torch.zeros(int((~kept).sum())))
    frac = 1 - kept.float().mean().item()
    if abs(frac - 0.25) > 0.03:
        failures.append(f"dropout: dropped fraction {frac:.3f}, expected about 0.25")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for t in (test_conv, test_pools, test_batchnorm, test_losses, test_elementwise):
            t(tmp)
    for f in failures:
        print("FAIL:", f)
    print(f"test_ops_torch: {checks} checks, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
