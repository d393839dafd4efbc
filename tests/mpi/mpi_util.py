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
