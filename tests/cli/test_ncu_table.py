"""bench/gpu/ncu_table.py on reports in Nsight Compute's CSV form.

ncu itself is only on the GPU machine, so the table script is checked
here on CSV written as `ncu --import R --csv --page raw --print-units base
--metrics gpu__time_duration.sum` prints it (a header row, a units row,
one row per kernel launch, program output and ==PROF== lines before it):
kernels grouped by their name without the argument list, templated names
kept whole, times per step in ms from any of ncu's time units, the rest
summed under --top, and a clear error (exit 1) for a report without the
metric, with an unknown unit or with no kernels.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("CTRAIN_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(SRC, "bench", "gpu", "ncu_table.py")
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","gpu__time_duration.sum"\n')


def units(u):
    return '"","","","","","","","","","","","%s"\n' % u


def row(i, name, t):
    return '"%d","77","bench_train","127.0.0.1","%s","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","%s"\n' % (i, name, t)


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


fails = 0


def check(cond, what, r=None):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what)
        if r is not None:
            print(r.stdout, r.stderr)


body = ("==PROF== Connected to process 77\nRESULT workload=alexnet\n" + HEAD + units("nsecond") +
        row(0, "k_add(int, const void *, int, const void *, int, void *, int, long, int)", "400000") +
        row(1, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
               "std::array<char *, 1>>(int, T2, T3)", "1,200") +
        row(2, "k_add(int, const void *, int, const void *, int, void *, int, long, int)", "600000") +
        row(3, "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwc", "2000000") +
        row(4, "k_fill(void *, int, float, long, int)", "800"))
r = run(body, "--steps", "2", "--title", "ctrain alexnet fp16")
check(r.returncode == 0, "a well-formed report", r)
out = r.stdout
check("ctrain alexnet fp16: 5 kernels over 2 step(s), 1.501 ms of kernel time a step" in out, "the total line", r)
check("| `k_add` | 1 | 0.500 | 33.3% |" in out, "k_add's two launches grouped, 0.5 ms a step", r)
check("| `sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwc` | 0.5 | 1.000 | 66.6% |" in out,
      "a name without arguments kept whole", r)
check("`at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>`" in out,
      "template arguments kept, the argument list cut, 1,200 read as 1200", r)
lines = [ln for ln in out.splitlines() if ln.startswith("| `")]
check(lines and "sm90_xmma" in lines[0] and "k_fill" in lines[-1], "rows by time, largest first", r)

r = run(body, "--top", "2")
check(r.returncode == 0 and "| 2 other kernels | 2 | 0.002 | 0.1% |" in r.stdout, "--top sums the rest", r)

r = run(HEAD + units("usecond") + row(0, "k_x()", "2.5"))
check(r.returncode == 0 and "| `k_x` | 1 | 0.003 |" in r.stdout, "microseconds", r)

r = run(HEAD.replace("gpu__time_duration.sum", "sm__cycles_elapsed.avg") + units("cycle") + row(0, "k()", "5"))
check(r.returncode == 1 and "gpu__time_duration.sum" in r.stderr and not r.stdout, "a report without the metric", r)
r = run(HEAD + units("furlong") + row(0, "k()", "5"))
check(r.returncode == 1 and "unit 'furlong'" in r.stderr, "an unknown unit", r)
r = run(HEAD + units("nsecond"))
check(r.returncode == 1 and "no kernel rows" in r.stderr, "a range with no kernels", r)
r = run(body, "--steps", "0")
check(r.returncode == 2, "--steps 0 refused", r)

print("test_ncu_table: %d failed" % fails)
sys.exit(1 if fails else 0)
