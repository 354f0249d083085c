#!/usr/bin/env bash
# Issue 19 on one H200 (device tool): the Mosaic GPU forward's launch settings and schedule
# options against cuDNN (`experiments/11_mgpu_forward_ab.py`: interleaved pairs, a same-bits
# check per numerics), with ptxas's register and spill report, after the GPU tests of the
# schedules (tests.log; AB_TESTS=0 leaves them out): (1) non-causal, block_k 64 with and
# without overlap (FlashAttention-3's intra-warpgroup overlap, new 2026-12-04), overlap +
# opt_barrier, opt_barrier, k_wait_in_pv; block_k 128 with and without overlap, opt_barrier;
# (2) causal, block_k 64 and 128 with and without overlap, 128 with longest_first (the stages,
# early_turn and the first 10-pair round of the others ran 2026-12-03: docs/studies/speed.md).
# ptxas.txt keeps its registers, spills and any "wgmma ... serialized" warning (C75xx: the
# overlap's two wgmmas not pipelined, and why). Lines land in
# $OUT/ab.txt as they come (a call cut at its limit still brings back what ran); ptxas's report
# (registers, spills per kernel) in $OUT/ptxas.txt. Usage (repo root, on the device):
#   bash experiments/h200_ab_check.sh "$OUT"
# As an item of h200_instability.sh's queues: "ab".
# device seconds: 590 (its timeouts added up, with start-up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
# first the GPU's own check of the schedules (the same bits with and without each option, one
# stage included: the causal drain's barrier order changed on 2026-12-03) and of the causal
# forward against Triton
# (AB_TESTS=0 leaves them out: they passed on the H200 on 2026-12-03, 10 passed in 98 s; the
# overlap's three cases are new: on the GPU they compare its fused path, which interpret mode
# does not run, with the default's)
if [[ ${AB_TESTS:-1} != 0 ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
    -k "schedules or (matches_triton_forward and causal)" > $OUT/tests.log 2>&1
  echo "tests: exit $?"; tail -3 $OUT/tests.log
fi
export MOSAIC_GPU_DUMP_PTXAS=1  # ptxas's registers and spills per kernel, in compile order
# (ptxas's report comes on stdout, the runs' errors on stderr: both into compile.log; the
# variants' lines land in ab.txt)
AB="python3 experiments/11_mgpu_forward_ab.py --pairs 30 --out $OUT/ab.txt"
# overlap's first timing, the repeat of 2026-12-03's leads (10 pairs, a 1.4–2.3% spread
# between repeats: opt_barrier +2.8–3.8%, longest_first at block_k 128 undecided) and
# k_wait_in_pv's first timing
timeout 280 $AB bk=64 bk=64,overlap=1 bk=64,overlap=1,opt_barrier=1 bk=64,opt_barrier=1 \
  bk=64,k_wait_in_pv=1 bk=128 bk=128,overlap=1 bk=128,opt_barrier=1 > $OUT/compile.log 2>&1
echo "options: exit $?"
timeout 150 $AB --causal bk=64 bk=64,overlap=1 bk=128 bk=128,overlap=1 bk=128,longest_first=1 \
  >> $OUT/compile.log 2>&1
echo "causal: exit $?"
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
