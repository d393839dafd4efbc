"""Helpers shared by the model parity tests (fp32 and bf16 autocast): the
failure list, the error metric, the model_runner tool, the PyTorch model of
a case, and the pieces that make PyTorch follow ctrain's ReLU decisions and
treat bias-before-BatchNorm gradients as the rounding noise they are."""
import math
import os
import subprocess

import torch
import torch.nn as nn

import ctrain_models as cm

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
SRC = os.environ.get("CTRAIN_SOURCE_DIR", os.path.join(HERE, "..", ".."))
RUNNER = os.path.join(BUILD, "tests", "model_runner")
# CTRAIN_TEST_DEVICE=cuda: the model parity tests run ctrain's step on its
# cuda device (a GPU, or the CUDA emulator's build, tests/emu).
ON_CUDA = os.environ.get("CTRAIN_TEST_DEVICE", "") == "cuda"

failures = []


def torch_device():
    """PyTorch's side of a model parity test: the GPU when ctrain runs on
    cuda and this PyTorch has one, with TF32 off (ctrain's default cuda
    device computes f32 in f32); the CPU otherwise."""
    if not (ON_CUDA and torch.cuda.is_available()):
        return "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return "cuda"


def ctrain_sees_cuda():
    """Whether `ctrain devices` of the build under test lists cuda:0."""
    out = subprocess.run([os.path.join(BUILD, "ctrain"), "devices"], capture_output=True, text=True).stdout
    return "\ncuda:0" in out


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def rel_err(a, b):
    """max |a - b| / max |b| (the reference's largest magnitude, so tiny
    entries do not blow the ratio up); inf if the shapes differ. In f32
    unless a side is f64: a difference of two f32 values is exact when they
    are within a factor of 2 and off by one rounding (2^-24 of itself)
    otherwise, and f32 halves the memory traffic of the large models."""
    wide = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    a = a.to(wide)
    b = b.to(wide)
    if a.shape != b.shape:
        return math.inf
    ref = b.abs().max().item() if b.numel() else 0.0
    d = (a - b).abs().max().item() if b.numel() else 0.0
    return d / ref if ref > 0 else d


def run_runner(args):
    p = subprocess.run([RUNNER] + args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("model_runner %s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p.stdout


def torch_model(label, model, inp, classes):
    """(PyTorch model, input dims) of a case: a zoo name or "text:" + a model file."""
    if label.startswith("text:"):
        return cm.parse_model_text(model)
    dims = tuple(int(v) for v in inp.split("x"))
    if len(dims) == 3:
        return cm.build(model, dims[0], dims[1], dims[2], classes), dims
    return cm.build(model, dims[0], 1, 1, classes), dims


class MaskedReLU(torch.autograd.Function):
    """ReLU whose backward takes the branch ctrain's forward took (the mask
    follows the gradient's dtype, so it works under autocast too)."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask.to(x.dtype))
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask.to(g.dtype), None


def bias_before_bn(model):
    """{bias key: weight key} of Conv2d/Linear biases that feed a BatchNorm
    directly: their exact gradient is 0 (BN subtracts the batch mean), so
    both sides hold rounding noise; they are compared against the scale of
    the layer's weight gradient instead of their own."""
    out = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Sequential):
            continue
        kids = list(mod.named_children())
        for (na, a), (_, b) in zip(kids, kids[1:]):
            if isinstance(a, (nn.Conv2d, nn.Linear)) and a.bias is not None and \
                    isinstance(b, (nn.BatchNorm1d, nn.BatchNorm2d)):
                p = (name + "." if name else "") + na
                out[p + ".bias"] = p + ".weight"
    return out
