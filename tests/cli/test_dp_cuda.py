"""DataParallel over GPUs in one process (`ctrain train --strategy dp
--devices cuda:0,cuda:1`): a replica per GPU, each driven by a thread of
its own, their gradients summed by NCCL's collectives on each device's
collective stream, against single-GPU training on the same global batch.

Needs two CUDA devices (skipped otherwise). In `make test` it runs on the
CUDA emulator (tests/emu: CT_EMU_DEVICES=2 emulates two GPUs in the one
process, its NCCL ranks meeting in memory), which also fails any kernel,
library call or collective handed another device's memory or stream; on a
machine with two GPUs the plain build runs it on the hardware.

- Equal to one device: DP with batch 32 over 2 GPUs gives the weights one
  GPU gives after 20 steps, within 1e-5: the mlp, the cnn with its
  dropout, with clipping and accumulation (cli_util.GPU_PARALLEL_CASES,
  DDP's cases too); a last batch of one sample (257 samples) as well.
  Under bf16 autocast DP is held to what one GPU moves when it
  accumulates the batch in two halves; under fp16 the loss scaler skips
  the same steps and ends at the same scale.
- Gradient buckets: --bucket-mb 0.001 (a bucket per layer) gives the
  default's bits, and on the emulator (its CT_EMU_TRACE) the first
  bucket's all-reduce is queued while the backward still has convolution
  gradients to queue: the sums overlap the backward.
- --cuda-graph: each replica's step, its NCCL calls included, is captured
  after the warm-up steps and replayed, with the eager run's bits (the
  emulator's in-process ranks meet inside the replays).
- A run repeats bit for bit, a run stopped mid-epoch (--max-steps 6)
  resumes to the uninterrupted run's bits (the optimizer's state read
  back from the first GPU), and the evaluation's accuracy is one GPU's.
- SyncBatchNorm (--sync-bn) on a batch-norm model trains as one GPU does
  (within 1e-4; without it the weights drift further). Its sums stay on
  the GPUs: on the emulator (its CT_EMU_TRACE) a step with --sync-bn
  waits on the host exactly as often as one without, after a first step
  that sizes the layers' scratch.
- A host device beside a GPU and one GPU listed twice are refused.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as u  # noqa: E402

DP = ["--strategy", "dp", "--devices", "cuda:0,cuda:1"]


def main():
    u.need_binary()
    u.need_module("st_util")
    u.need_gpus(2)
    import numpy as np
    d = u.tmpdir("dp_cuda")
    try:
        u.write_idx_dataset(os.path.join(d, "data"), np.random.default_rng(0), n_train=128, n_test=33, h=28, w=28)
        data = ["--data", "mnist:" + os.path.join(d, "data"), "--device", "cuda", "--deterministic"]
        for name, args in u.GPU_PARALLEL_CASES:
            u.equals_one_device(d, name, args + data, two_gpus)
        tail = ["--data", "synthetic:257", "--input", "1x28x28", "--classes", "10", "--device", "cuda",
                "--deterministic"]
        u.equals_one_device(d, "cnn_tail", ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002"] + tail, two_gpus)
        u.sync_bn_equals_one_device(d, data, two_gpus)
        sync_bn_host_waits(d, data)
        buckets_overlap(d, data)
        u.bf16_within_split(d, data, two_gpus)
        u.fp16_scaler_agrees(d, data, 8, two_gpus, timeout=600)
        repeat_and_eval(d, data)
        refused(data)
    finally:
        u.cleanup(d)
    u.finish()


def two_gpus(args, what):
    return u.run_ok(["train"] + args + ["--batch-size", "32"] + DP, what, timeout=600)


def repeat_and_eval(d, data):
    """Two DP runs agree bit for bit; with lr 0 (the same weights) the
    evaluation split over the GPUs counts one GPU's hits exactly (33 test
    samples: uneven slices)."""
    args = ["--model", "mlp", "--epochs", "2"] + data + u.FAST
    a, b = os.path.join(d, "rep_a.safetensors"), os.path.join(d, "rep_b.safetensors")
    r = two_gpus(args + ["--save", a], "dp run a")
    two_gpus(args + ["--save", b], "dp run b")
    u.check(u.same_bits(u.weights(a), u.weights(b)), "DP over GPUs does not repeat bit for bit")
    graph = os.path.join(d, "rep_graph.safetensors")
    r = two_gpus(args + ["--cuda-graph", "--save", graph], "dp run with --cuda-graph")
    u.check("cuda graph: on" in r.stdout, "DP --cuda-graph: the replicas' steps were not captured: %s"
            % r.stdout[-400:])
    if os.path.exists(graph):
        u.check(u.same_bits(u.weights(a), u.weights(graph)), "DP over GPUs with --cuda-graph differs from eager")
    tiny = os.path.join(d, "rep_tiny.safetensors")
    two_gpus(args + ["--bucket-mb", "0.001", "--save", tiny], "dp run with a bucket per layer")
    if os.path.exists(tiny):
        u.check(u.same_bits(u.weights(a), u.weights(tiny)), "DP over GPUs: --bucket-mb 0.001 changes the weights")
    u.check("DataParallel over cuda:0,cuda:1" in r.stdout, "no DataParallel banner: %s" % r.stdout[-500:])
    ck, res = os.path.join(d, "rep_ck"), os.path.join(d, "rep_resumed.safetensors")
    two_gpus(args + ["--checkpoint-dir", ck, "--max-steps", "6"], "dp run stopped")
    two_gpus(args + ["--checkpoint-dir", ck, "--resume", "--save", res], "dp run resumed")
    if os.path.exists(res):
        u.check(u.same_bits(u.weights(a), u.weights(res)), "DP over GPUs: a resumed run differs from the uninterrupted")
    frozen = ["--model", "mlp", "--epochs", "1", "--max-steps", "2", "--lr", "0"] + data + u.FAST
    m1, m2 = os.path.join(d, "eval_1.json"), os.path.join(d, "eval_2.json")
    u.run_ok(["train"] + frozen + ["--batch-size", "32", "--metrics-json", m1], "eval one GPU", timeout=600)
    two_gpus(frozen + ["--metrics-json", m2], "eval dp")
    if os.path.exists(m1) and os.path.exists(m2):
        x, y = u.read_json(m1), u.read_json(m2)
        u.check(x["test_accuracy"] == y["test_accuracy"], "DP evaluation's accuracy %r != one GPU's %r"
                % (y["test_accuracy"], x["test_accuracy"]))


def traced(d, name, args):
    """Runs DP with args under the emulator's CT_EMU_TRACE; the trace's
    lines, or None where nothing wrote one (real GPUs)."""
    trace = os.path.join(d, name + ".trace")
    env = u.ENV
    u.ENV = dict(env, CT_EMU_TRACE=trace)
    try:
        two_gpus(args, name)
    finally:
        u.ENV = env
    if not os.path.exists(trace):
        print("%s: no emulator trace (real GPUs); not counted" % name)
        return None
    with open(trace) as f:
        return f.read().splitlines()


def buckets_overlap(d, data):
    """One step of the cnn with a bucket per layer: an all-reduce is queued
    before the backward's last convolution weight gradient."""
    lines = traced(d, "overlap", ["--model", "cnn", "--epochs", "1", "--max-steps", "1", "--bucket-mb", "0.001"]
                   + data + u.FAST)
    if lines is None:
        return
    first = next((i for i, ln in enumerate(lines) if "ncclAllReduce" in ln and not ln.startswith("sync")), None)
    last = max((i for i, ln in enumerate(lines) if "cudnnConvolutionBackwardFilter" in ln), default=None)
    print("trace: first all-reduce at line %s, last convolution weight gradient at line %s" % (first, last))
    u.check(first is not None and last is not None and first < last,
            "DP's bucket all-reduces do not start before the backward ends (lines %s and %s)" % (first, last))


def sync_bn_host_waits(d, data):
    """The host's waits (copies to the host, stream and event
    synchronisations; not the emulated NCCL's own) of 6 DP steps of the
    batch-norm model, with and without --sync-bn, from the emulator's
    trace; skipped where nothing writes one (real GPUs). Only the first
    step's scratch (a cudaFree per growth) may differ."""
    args = ["--model", u.write_bn_model(d), "--optimizer", "sgd", "--lr", "0.05", "--epochs", "1", "--max-steps",
            "6"] + data + u.FAST
    waits = []
    for extra in ([], ["--sync-bn"]):
        lines = traced(d, "host_waits_%d" % len(waits), args + extra)
        if lines is None:
            return
        waits.append(collections.Counter(ln for ln in lines if ln.startswith("sync - ") and "emulator:" not in ln
                                         and "cudaFree" not in ln and "cudaEventQuery" not in ln))
    print("host waits of 6 DP steps without / with --sync-bn: %d / %d" % (sum(waits[0].values()),
                                                                       sum(waits[1].values())))
    u.check(waits[0] == waits[1], "--sync-bn adds host waits: %s against %s" % (dict(waits[1]), dict(waits[0])))


def refused(data):
    base = ["train", "--model", "mlp", "--batch-size", "32", "--epochs", "1", "--max-steps", "2"] + data + u.FAST
    for extra, text in ((["--strategy", "dp", "--devices", "cuda:0,cpu:1"], "all host devices or all GPUs"),
                        (["--strategy", "dp", "--devices", "cuda,cuda:0"], "the same GPU")):
        r = u.run(base + extra, timeout=600)
        u.check(r.returncode != 0 and text in r.stderr, "%s: exit %d, expected a refusal naming %r: %s"
                % (" ".join(extra), r.returncode, text, r.stderr[-800:]))


if __name__ == "__main__":
    main()
