"""Runs one backend op through tests/tools/ref_op_dump (inputs and
outputs as raw little-endian files in a folder) for the op-level PyTorch
comparisons, test_ops_torch.py and test_nan_torch.py. Importing it exits
77 (skipped) when torch, numpy or the tool is missing."""
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError:
    print("torch/numpy not available: skipped")
    sys.exit(77)

BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
TOOL = os.path.join(BUILD, "tests", "ref_op_dump")
if not os.path.exists(TOOL):
    print(f"{TOOL} not built: skipped")
    sys.exit(77)


def run(tmp, op, ints, floats=(), device="ref", **inputs):
    """Writes the input tensors, runs op on device (exits 77 when the
    device does not open here); the outputs are then read with out()."""
    for name, t in inputs.items():
        t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(os.path.join(tmp, name + ".f32"))
    cmd = [TOOL, tmp, op] + [str(int(v)) for v in ints]
    if floats:
        cmd += ["--"] + [repr(float(v)) for v in floats]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", CTRAIN_OP_DEVICE=device)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode == 77:
        print(f"skip: {r.stderr.strip()}")
        sys.exit(77)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")


def out(tmp, name, ext="f32"):
    dt = "<f4" if ext == "f32" else "<i4"
    return torch.from_numpy(np.fromfile(os.path.join(tmp, f"{name}.{ext}"), dtype=dt).copy())
