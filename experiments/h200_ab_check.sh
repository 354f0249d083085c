#!/usr/bin/env bash
# Issue 19 on one Hopper GPU (device tool): the Mosaic GPU forward's and backward's speed
# options against cuDNN and each other (`experiments/11_mgpu_forward_ab.py`, forward against
# cuDNN; `18_mgpu_backward_stages_ab.py`, backward against the first variant: interleaved
# pairs, a same-bits check), with ptxas's register and spill report, after the GPU tests of the
# options (tests.log; AB_TESTS=0 leaves them out). Since 2026-12-06: the two options built that day
# on a CPU (experiments/20_ptxas_report.py counted their SASS): the forward's scale_in_exp2
# (the softmax scale in exp2's FMA, FlashAttention-2's own order) at block_k 64 with and
# without the compensation, causal too, and at 128, beside JAX's own attention_mgpu at the
# same tile (`jax=1`), and the backward's rounded_scores (S as PTX mul.rn.f32, no select)
# full and causal (d128, (3, 2) tiles); both change float32 values only, so the forward's
# lines say "first of its numerics" (scale_in_exp2 at head_dim 128 is part of experiment 11's
# numerics key) and the backward's "DIFFERS" with the largest difference (first run on an H100 on 2026-12-06, with AB_QUICK and
# the rest by hand, experiments/results/h100-2026-12-06-b128; rounded_scores is the default
# since, so the backward lines now time it against rounded_scores=0). The runs of 2026-12-03, -04 and -05
# (docs/studies/speed.md; experiments/results/h200-2026-12-05b-b128) are this script at
# commits 16ec62f, df624af and a820fa9.
# ptxas.txt keeps its registers, spills and any "wgmma ... serialized" warning (C75xx: a branch
# or the overlap keeping two wgmmas from pipelining). Lines land in
# $OUT/ab.txt as they come (a call cut at its limit still brings back what ran); ptxas's report
# (registers, spills per kernel) in $OUT/ptxas.txt. Usage (repo root, on the device):
#   bash experiments/h200_ab_check.sh "$OUT"
#   AB_QUICK=1 bash experiments/h200_ab_check.sh "$OUT"   # ≤ 330 s: the tests, the full
#     forward at block_k 64 and the full backward only (what a call after a twin has left)
# As an item of h200_instability.sh's queues: "ab".
# device seconds: 590 (its timeouts added up, with start-up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
# first the options' GPU tests: scale_in_exp2 against the default (float32 values only) and
# the FP64 rule, rounded_scores against the plain product, the backward against Triton
if [[ ${AB_TESTS:-1} != 0 ]]; then
  timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
    -k "scale_in_exp2 or rounded_scores or backward_matches" > $OUT/tests.log 2>&1
  echo "tests: exit $?"; tail -3 $OUT/tests.log
fi
export MOSAIC_GPU_DUMP_PTXAS=1  # ptxas's registers and spills per kernel, in compile order
# (ptxas's report comes on stdout, the runs' errors on stderr: both into compile.log; the
# variants' lines land in ab.txt)
AB="python3 experiments/11_mgpu_forward_ab.py --pairs 30 --out $OUT/ab.txt"
timeout 140 $AB bk=64 bk=64,scale_in_exp2=1 bk=64,comp=0 bk=64,comp=0,scale_in_exp2=1 \
  jax=1,bk=64 > $OUT/compile.log 2>&1
echo "full: exit $?"
if [[ ${AB_QUICK:-0} == 0 ]]; then
timeout 80 $AB --causal bk=64 bk=64,scale_in_exp2=1 >> $OUT/compile.log 2>&1
echo "causal: exit $?"
timeout 100 $AB bk=128 bk=128,scale_in_exp2=1 jax=1,bk=128 >> $OUT/compile.log 2>&1
echo "block_k 128: exit $?"
fi
BW="python3 experiments/18_mgpu_backward_stages_ab.py --pairs 30 --shape 4,4096,16,16,128 --out $OUT/ab.txt"
timeout 60 $BW 3,2,rounded_scores=0 3,2 >> $OUT/compile.log 2>&1
echo "backward: exit $?"
if [[ ${AB_QUICK:-0} == 0 ]]; then
timeout 60 $BW --causal 3,2,rounded_scores=0 3,2 >> $OUT/compile.log 2>&1
echo "backward causal: exit $?"
fi
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
