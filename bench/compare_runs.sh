#!/usr/bin/env bash
# Bit-for-bit comparison of two ctrain binaries (a refactoring must not
# change a number): the same fixed-seed CPU runs through both, then cmp of
# the saved weights, the final metrics and, for the resume, the last
# checkpoint. Usage: bench/compare_runs.sh OLD_CTRAIN NEW_CTRAIN [OUTDIR]
# Runs: `make train`'s recipe, the seed recipe (cnn, Adam 2e-3, 3 epochs),
# and a run stopped by --max-steps then resumed against one uninterrupted
# (both with --accumulate 2 and a bf16 model, the paths a step refactoring
# touches most). Data: /usr/share/datasets/fashion-mnist.
set -u
old=$1 new=$2 out=${3:-$(mktemp -d)}
mkdir -p "$out"
fail=0
run() { # name, args...
  local name=$1; shift
  for side in old new; do
    local bin=$old; [ $side = new ] && bin=$new
    rm -rf "$out/$name-$side.ck"
    "$bin" train "$@" --save "$out/$name-$side.safetensors" --metrics-json "$out/$name-$side.json" \
      >"$out/$name-$side.log" 2>&1 || { echo "$name: $side failed (see $out/$name-$side.log)"; fail=1; }
  done
}
same() { # name, file suffix
  if cmp -s "$out/$1-old$2" "$out/$1-new$2"; then echo "$1$2: identical"; else echo "$1$2: DIFFERENT"; fail=1; fi
}
metrics() { # the JSON without wall times
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(json.dumps({k: v for k, v in d.items() if "second" not in k}, sort_keys=True))' "$1"
}
run train --model convnet --data fashion-mnist --epochs 4 --batch-size 128 --optimizer adam --lr 0.001 --scheduler cosine
same train .safetensors
run seed --model cnn --data fashion-mnist --epochs 3 --batch-size 128 --optimizer adam --lr 0.002
same seed .safetensors
# Resume: stop after 150 of an epoch's 469 steps, resume to the end.
common="--model cnn --data fashion-mnist --epochs 1 --batch-size 128 --optimizer adam --lr 0.002 --accumulate 2 --precision bf16"
for side in old new; do
  bin=$old; [ $side = new ] && bin=$new
  ck=$out/resume-$side.ck; rm -rf "$ck"
  "$bin" train $common --checkpoint-dir "$ck" --max-steps 75 >"$out/resume-$side.log" 2>&1 &&
  "$bin" train $common --checkpoint-dir "$ck" --resume --save "$out/resume-$side.safetensors" \
    --metrics-json "$out/resume-$side.json" >>"$out/resume-$side.log" 2>&1 || { echo "resume: $side failed"; fail=1; }
done
same resume .safetensors
for n in train seed resume; do
  if [ "$(metrics "$out/$n-old.json")" = "$(metrics "$out/$n-new.json")" ]; then echo "$n metrics: identical"
  else echo "$n metrics: DIFFERENT"; fail=1; fi
done
echo "logs and files in $out"
exit $fail
