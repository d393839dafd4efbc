#!/bin/sh
# run_mpi.sh N PROGRAM [ARGS]: PROGRAM on N ranks through mpirun, with the
# flags root (containers) and more ranks than cores need. Exit 77
# (skipped) without mpirun.
n=$1
shift
command -v mpirun >/dev/null 2>&1 || { echo "skip: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
root=
[ "$(id -u)" = 0 ] && root=--allow-run-as-root
exec mpirun -np "$n" $root --oversubscribe "$@"
