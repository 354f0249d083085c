#!/usr/bin/env bash
# Issue 19 on one Hopper GPU (device tool): the Mosaic GPU forward's and backward's speed
# options against cuDNN and each other (`experiments/11_mgpu_forward_ab.py`, forward against
# cuDNN; `18_mgpu_backward_stages_ab.py`, backward against the first variant: interleaved
# pairs, a same-bits check), with ptxas's register and spill report, after the GPU tests
# (tests.log; AB_TESTS=0 leaves them out). Since the three warpgroups went (2026-12-06): the GPU
# tests, then the default backward against the dQ key tile of 128 (`bk_dq=128`, the same bits)
# at gpt2-small's shape (16 × 1024 × 12 × d64, causal: where the training step's gap to cuDNN
# is) and at 4 × 4096 × 16 × d64 (causal and full), and the forward at gpt2-small's shape with
# and without the compensation and the ping-pong, beside JAX's own kernel. Before it, the runs
# of 2026-12-03 to -06 (docs/studies/speed.md) are this script at commits 16ec62f, df624af,
# a820fa9, c082e4d, 8078849 and 91e49f5 (the last: three compute warpgroups against two,
# 1.07–1.56× the time, since removed; experiments/results/h100-2026-12-06c-b128).
# ptxas.txt keeps its registers, spills and any "wgmma ... serialized" warning (C75xx). Lines
# land in $OUT/ab.txt as they come (a call cut at its limit still brings back what ran).
# Usage (repo root, on the device):
#   bash experiments/h200_ab_check.sh "$OUT"
#   AB_TESTS_ONLY=1 bash experiments/h200_ab_check.sh "$OUT"   # the GPU tests alone (≤ 150 s)
#   AB_QUICK=1 bash experiments/h200_ab_check.sh "$OUT"   # ≤ 300 s: the tests and the
#     backward at gpt2-small's shape only (what a call after a twin has left)
# As an item of h200_instability.sh's queues: "ab".
# device seconds: 620 (its timeouts added up, with start-up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
mkdir -p "$OUT"
source "$(dirname "$0")/h200_env.sh"
# first the GPU tests: the dQ key tile of 128, the causal forward and backward against Triton
# and FP64 (the masks' change: the same values; padded warpgroups computing nothing), the head
# dims
if [[ ${AB_TESTS:-1} != 0 ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_mosaic_gpu.py \
    -k "backward_matches or matches_triton or head_dims or dq_key_tile" > $OUT/tests.log 2>&1
  echo "tests: exit $?"; tail -3 $OUT/tests.log
fi
# AB_TESTS_ONLY=1: the tests alone (correctness, not timing: they may share a GPU with a
# training twin where its memory allows, as on an H200 beside a 68.5 GiB twin)
[[ ${AB_TESTS_ONLY:-0} != 0 ]] && exit 0
export MOSAIC_GPU_DUMP_PTXAS=1  # ptxas's registers and spills per kernel, in compile order
# (ptxas's report comes on stdout, the runs' errors on stderr: both into compile.log; the
# variants' lines land in ab.txt)
GPT2="--shape 16,1024,12,12,64 --causal"
BW="python3 experiments/18_mgpu_backward_stages_ab.py --pairs 30 --out $OUT/ab.txt"
timeout 150 $BW $GPT2 2,2 2,2,bk_dq=128 > $OUT/compile.log 2>&1
echo "backward, gpt2-small: exit $?"
if [[ ${AB_QUICK:-0} == 0 ]]; then
timeout 80 $BW --shape 4,4096,16,16,64 --causal 2,2 2,2,bk_dq=128 >> $OUT/compile.log 2>&1
echo "backward d64, 4096 causal: exit $?"
timeout 70 $BW --shape 4,4096,16,16,64 2,2 2,2,bk_dq=128 >> $OUT/compile.log 2>&1
echo "backward d64, 4096 full: exit $?"
AB="python3 experiments/11_mgpu_forward_ab.py --pairs 30 --out $OUT/ab.txt"
timeout 120 $AB $GPT2 bk=64 bk=64,comp=0 bk=64,pingpong=0 jax=1,bk=64 >> $OUT/compile.log 2>&1
echo "forward, gpt2-small: exit $?"
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
