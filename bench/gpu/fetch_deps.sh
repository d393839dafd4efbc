#!/usr/bin/env bash
# Packs what a bare GPU machine lacks to build and benchmark ctrain into
# .deps/ (git-ignored), to be carried with the call. The device tool's
# image has the CUDA toolkit, cuDNN/NCCL as Python wheels, PyTorch, CMake
# and gcc, but no oneDNN, possibly no zlib headers, no Fashion-MNIST and
# no package registry. Run it HERE (it needs apt-get), then on the device:
#   run(command="OUT=$OUT QUICK=1 bench/gpu/run_gpu.sh", carry=[".deps"])
# run_gpu.sh unpacks .deps/debs into /tmp/ctrain-deps (never into /) and
# points CMake and the loader there, and reads .deps/fashion-mnist.
# Size: about 8 MiB of packages plus 30 MiB of data (the tool carries 64).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$ROOT/.deps
rm -rf "$D/debs"
mkdir -p "$D/debs"
# oneDNN (runtime + headers + CMake config), the OpenCL ICD loader that
# Debian's libdnnl links, and zlib (headers and the runtime its link name
# points at).
(cd "$D/debs" && apt-get download libdnnl2 libdnnl-dev ocl-icd-libopencl1 zlib1g zlib1g-dev)
FM=${FMNIST:-/usr/share/datasets/fashion-mnist}
if [[ -d $FM ]]; then
  mkdir -p "$D/fashion-mnist"
  cp "$FM"/*-ubyte.gz "$D/fashion-mnist/"
else
  echo "no Fashion-MNIST at $FM (apt-get install dataset-fashion-mnist, or FMNIST=DIR): the time-to-91% row will be skipped" >&2
fi
du -sh "$D"
