#!/usr/bin/env bash
# Issue 19 on one H200 (device tool): the Mosaic GPU forward's launch settings and schedule
# options against cuDNN (`experiments/11_mgpu_forward_ab.py`: interleaved pairs, a same-bits
# check per numerics), with ptxas's register and spill report, after the GPU tests of the
# schedules (tests.log): (1) non-causal, the stages at
# block_k 64 and 128, ± compensation; (2) opt_barrier, early_turn, k_wait_in_pv; (3) causal,
# longest_first. Lines land in
# $OUT/ab.txt as they come (a call cut at its limit still brings back what ran); ptxas's report
# (registers, spills per kernel) in $OUT/ptxas.txt. Usage (repo root, on the device):
#   bash experiments/h200_ab_check.sh "$OUT"
# As an item of h200_instability.sh's queues: "ab".
# device seconds: 560 (its timeouts added up, with start-up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
# first the GPU's own check of the schedules (the same bits with and without each option, one
# stage included: the causal drain's barrier order changed on 2026-12-03) and of the causal
# forward against Triton
# (AB_TESTS=0 leaves them out: they passed on the H200 on 2026-12-03, 10 passed in 98 s)
if [[ ${AB_TESTS:-1} != 0 ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
    -k "schedules or (matches_triton_forward and causal)" > $OUT/tests.log 2>&1
  echo "tests: exit $?"; tail -3 $OUT/tests.log
fi
export MOSAIC_GPU_DUMP_PTXAS=1  # ptxas's registers and spills per kernel, in compile order
AB="python3 experiments/11_mgpu_forward_ab.py --pairs 10 --out $OUT/ab.txt"
timeout 130 $AB bk=64,st=2 bk=64,st=3 bk=64,st=4 bk=64,st=5 bk=128,st=2 bk=64,st=2,comp=0 \
  2> $OUT/stderr.log
echo "stages: exit $?"
timeout 150 $AB bk=64 bk=64,opt_barrier=1 bk=64,opt_barrier=1,early_turn=1 bk=64,k_wait_in_pv=1 \
  bk=64,opt_barrier=1,k_wait_in_pv=1 bk=128 bk=128,opt_barrier=1 2>> $OUT/stderr.log
echo "options: exit $?"
timeout 90 $AB --causal bk=64 bk=64,longest_first=1 bk=128 bk=128,longest_first=1 2>> $OUT/stderr.log
echo "causal: exit $?"
# each kernel's "Compiling entry" line followed by its register and spill lines, in order (the
# variants compile in the order ab.txt lists them)
grep -iE "spill|registers|Function properties|Compiling entry" $OUT/stderr.log > $OUT/ptxas.txt
head -c 20000 $OUT/stderr.log > $OUT/stderr_head.log && rm $OUT/stderr.log
cat $OUT/ab.txt
grep -ciE "spill" $OUT/ptxas.txt | sed 's/^/ptxas lines naming spills: /'
