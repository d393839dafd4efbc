"""DistributedDataParallel over GPUs (`ctrain train --strategy ddp --device
cuda`): NCCL's collectives on each device's collective stream, against
single-GPU training on the same global batch.

Needs two CUDA devices, one per rank (skipped otherwise). In `make test`
it runs on the CUDA emulator (tests/emu: CT_EMU_DEVICES=2, each rank a
process emulating one GPU, its NCCL over MPI), so the backend's own
collective code runs in CI; on a machine with two GPUs the plain build
runs it on the hardware.

- Equal to one device: 2 ranks with 16 samples each give the weights one
  GPU gives with batch 32 after 20 steps, within 1e-5: the mlp, the cnn
  with its dropout (masks keyed by the sample's number in the global
  batch), with clipping and accumulation. Under bf16 autocast the
  weight gradients are rounded per micro-batch on the GPU, so DDP is held
  to what one GPU moves when it accumulates the batch in two halves.
  Under fp16 the loss scaler skips the same steps and ends at the same
  scale.
- A run repeats bit for bit; --check-sync compares the weights on the
  ranks every few steps (copied back from the devices).
- What is not built for GPUs is refused at start, naming it: --zero 1
  and --sync-bn on cuda.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_util as mu  # noqa: E402
from mpi_util import u  # noqa: E402


def main():
    u.need_binary()
    u.need_module("st_util")
    mu.need_mpi_build()
    u.need_gpus(2)
    import numpy as np
    d = u.tmpdir("ddp_cuda")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=128, n_test=32, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data"), "--device", "cuda", "--deterministic"]
        equivalence(d, data)
        repeat_and_check(d, data)
        refused(d, data)
    finally:
        u.cleanup(d)
    u.finish()


def two_ranks(args, what):
    mu.ddp_ok(2, args + ["--batch-size", "16"], what, timeout=600)


def equivalence(d, data):
    for name, args in u.GPU_PARALLEL_CASES:
        u.equals_one_device(d, name, args + data, two_ranks)
    u.bf16_within_split(d, data, two_ranks)
    u.fp16_scaler_agrees(d, data, 8, two_ranks, timeout=600)


def repeat_and_check(d, data):
    args = ["--model", "mlp", "--batch-size", "16", "--epochs", "2", "--check-sync", "3"] + data + u.FAST
    a, b = os.path.join(d, "rep_a.safetensors"), os.path.join(d, "rep_b.safetensors")
    r = mu.ddp_ok(2, args + ["--save", a], "ddp run a", timeout=600)
    mu.ddp_ok(2, args + ["--save", b], "ddp run b", timeout=600)
    u.check(u.same_bits(u.weights(a), u.weights(b)), "DDP over GPUs does not repeat bit for bit")
    u.check("cuda:0" in r.stdout, "rank 0 did not train on cuda:0: %s" % r.stdout[-500:])


def refused(d, data):
    base = ["--model", "mlp", "--batch-size", "16", "--epochs", "1", "--max-steps", "2"] + data + u.FAST
    for extra, text in ((["--zero", "1"], "ZeRO"), (["--sync-bn"], "SyncBatchNorm")):
        r = mu.ddp(2, base + extra, timeout=600)
        u.check(r.returncode != 0 and text in r.stderr,
                "%s on cuda: exit %d, expected a refusal naming %s: %s" % (" ".join(extra), r.returncode, text,
                                                                           r.stderr[-800:]))


if __name__ == "__main__":
    main()
