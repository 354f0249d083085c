#!/usr/bin/env bash
# Issue 19 on one Hopper GPU (device tool): the Mosaic GPU forward's and backward's speed
# options against cuDNN and each other (`experiments/11_mgpu_forward_ab.py`, forward against
# cuDNN; `18_mgpu_backward_stages_ab.py`, backward against the first variant: interleaved
# pairs, a same-bits check), with ptxas's register and spill report, after the GPU tests of the
# options (tests.log; AB_TESTS=0 leaves them out), then `19_timing_methods.py` (the bench
# table's timing against the targets' pairs): ours at block_k 64 with and without the
# compensation, causal with and without longest_first (the default since 2026-12-05), the
# backward's causal dQ kernel with and without it (d128, (3, 2) tiles), and JAX's own
# attention_mgpu at block_kv 64 and 128 (`jax=1`: what the key tile costs a Mosaic GPU kernel
# without our numerics), full and causal. Its run of 2026-12-05 (at a820fa9, which also timed
# the since-removed skip_rescale): docs/studies/speed.md,
# experiments/results/h200-2026-12-05b-b128.
# (The variants of 2026-12-03 and 2026-12-04, docs/studies/speed.md, are this script at commits
# 16ec62f and df624af.)
# ptxas.txt keeps its registers, spills and any "wgmma ... serialized" warning (C75xx: a branch
# or the overlap keeping two wgmmas from pipelining). Lines land in
# $OUT/ab.txt as they come (a call cut at its limit still brings back what ran); ptxas's report
# (registers, spills per kernel) in $OUT/ptxas.txt. Usage (repo root, on the device):
#   bash experiments/h200_ab_check.sh "$OUT"
# As an item of h200_instability.sh's queues: "ab".
# device seconds: 590 (its timeouts added up, with start-up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
# first the GPU's own check that the schedule options are the same function, the backward's
# longest_first included
if [[ ${AB_TESTS:-1} != 0 ]]; then
  timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
    -k "schedules or longest_first_is" > $OUT/tests.log 2>&1
  echo "tests: exit $?"; tail -3 $OUT/tests.log
fi
export MOSAIC_GPU_DUMP_PTXAS=1  # ptxas's registers and spills per kernel, in compile order
# (ptxas's report comes on stdout, the runs' errors on stderr: both into compile.log; the
# variants' lines land in ab.txt)
AB="python3 experiments/11_mgpu_forward_ab.py --pairs 30 --out $OUT/ab.txt"
timeout 150 $AB bk=64 bk=64,comp=0 jax=1,bk=64 jax=1,bk=128 > $OUT/compile.log 2>&1
echo "full: exit $?"
timeout 150 $AB --causal bk=64,longest_first=0 bk=64 jax=1,bk=64 jax=1,bk=128 \
  >> $OUT/compile.log 2>&1
echo "causal: exit $?"
timeout 80 python3 experiments/18_mgpu_backward_stages_ab.py --pairs 30 --causal \
  --shape 4,4096,16,16,128 --out $OUT/ab.txt 3,2,longest_first=0 3,2 >> $OUT/compile.log 2>&1
echo "backward: exit $?"
# each kernel's "Compiling entry" line followed by its register and spill lines, in order (the
# variants compile in the order ab.txt lists them), each variant's "# compiling SPEC" before
# its kernel's lines (2026-12-04, where the lines were not named, the three C7513 warnings fell
# just before the "Compiling entry" lines of the three overlap kernels whose ratio to cuDNN
# was 19–23% lower: apparently ptxas warns before that line; docs/studies/speed.md)
grep -iE "^# compiling|spill|registers|Function properties|Compiling entry|serialized|C75[0-9][0-9]" $OUT/compile.log \
  > $OUT/ptxas.txt
grep -vE "^ptxas|^    0 bytes|^$" $OUT/compile.log | head -c 20000 > $OUT/compile_head.log
rm $OUT/compile.log
cat $OUT/ab.txt
echo "ptxas: $(grep -c "Compiling entry" $OUT/ptxas.txt) kernels, $(grep -cE "[1-9][0-9]* bytes spill" $OUT/ptxas.txt) lines with a spill, $(grep -ciE "serialized" $OUT/ptxas.txt) wgmma serialisation warnings"
timeout 100 python3 experiments/19_timing_methods.py --out $OUT/timing-methods.txt > /dev/null 2>&1
echo "timing methods: exit $?"
