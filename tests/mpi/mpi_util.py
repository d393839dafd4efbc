"""Shared helpers for the data-parallel tests: mpirun as this machine
allows it (weight comparisons are cli_util's)."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cli"))
import cli_util as u  # noqa: E402


def mpirun_prefix(n):
    """mpirun -np n, with the flags root needs (containers) and ranks
    outnumbering cores need; exits 77 (skipped) without mpirun."""
    exe = shutil.which("mpirun")
    if not exe:
        print("skip: mpirun not found (apt-get install openmpi-bin)")
        sys.exit(77)
    cmd = [exe, "-np", str(n)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["--oversubscribe"]


def need_mpi_build():
    """Exits 77 when this ctrain was built without MPI."""
    r = u.run(["train", "--strategy", "ddp", "--model", "mlp", "--data", "synthetic:8", "--input", "4",
               "--epochs", "1", "--batch-size", "4", "--max-steps", "1"] + u.FAST, timeout=60)
    if r.returncode != 0 and "built without MPI" in r.stderr:
        print("skip:", r.stderr.strip())
        sys.exit(77)


def ddp(n, args, timeout=180, env=None):
    """`ctrain train --strategy ddp args` on n ranks (one thread each)."""
    cmd = mpirun_prefix(n) + [u.CTRAIN, "train", "--strategy", "ddp"] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=env or u.ENV)


def ddp_ok(n, args, what, **kw):
    r = ddp(n, args, **kw)
    u.check(r.returncode == 0, "%s: exit %d, stderr: %s" % (what, r.returncode, r.stderr.strip()[-2000:]))
    return r


def fp16_scaler_agrees(d, data, steps, timeout=180):
    """fp16 with the loss scaler started at 2^40, one process with batch 32
    and 2 ranks with 16: the first steps overflow and are skipped. An
    overflow on any rank is one in the summed gradients every rank holds,
    so all skip together, as one process does, and end at the same scale."""
    args = ["--model", "cnn", "--optimizer", "adam", "--lr", "0.002", "--seed", "1", "--precision", "fp16",
            "--loss-scale-init", "1099511627776"] + data + ["--epochs", "1", "--max-steps", str(steps)] + u.FAST
    m1, m2 = os.path.join(d, "fp16_1.json"), os.path.join(d, "fp16_2.json")
    u.run_ok(["train"] + args + ["--batch-size", "32", "--metrics-json", m1], "fp16 one process", timeout=timeout)
    ddp_ok(2, args + ["--batch-size", "16", "--metrics-json", m2], "fp16 ddp", timeout=timeout)
    if os.path.exists(m1) and os.path.exists(m2):
        a, b = u.read_json(m1), u.read_json(m2)
        print("fp16 scaler: one process skipped %s, scale %s; ddp skipped %s, scale %s" % (
            a["skipped_steps"], a["loss_scale"], b["skipped_steps"], b["loss_scale"]))
        u.check(a["skipped_steps"] > 0 and a["skipped_steps"] == b["skipped_steps"] and
                a["loss_scale"] == b["loss_scale"], "fp16 loss scaling: DDP skipped %s steps (scale %s), one process "
                "%s (scale %s)" % (b["skipped_steps"], b["loss_scale"], a["skipped_steps"], a["loss_scale"]))
