# 2026-12-07: P̄ = 2^((S − m)·k) (new) against the FMA 2^(S·k − m·k) (old): GPU tests, then
# experiment 11's default at two shapes, old and new, one process each
source experiments/h200_env.sh
nvidia-smi -L
gpu_tests 300 -n 6 tests/test_mechanism.py tests/test_compensation.py tests/test_golden.py tests/test_mosaic_gpu.py tests/test_backend_choice.py
ab() {  # label
  timeout 75 python3 experiments/11_mgpu_forward_ab.py --pairs 20 --out "$OUT/ab_$1.txt" bk=64 > "$OUT/ab_$1.log" 2>&1
  timeout 60 python3 experiments/11_mgpu_forward_ab.py --pairs 20 --causal --shape 16,1024,12,12,64 --out "$OUT/ab_$1.txt" bk=64 >> "$OUT/ab_$1.log" 2>&1
  echo "$1: exit $?"; grep -E "cudnn|bk=" "$OUT/ab_$1.txt"
}
ab new
set_line pallas_kernels/policy.py '      return jnp.exp2((s - m) * (scale * LOG2E))' '      return jnp.exp2(s * (scale * LOG2E) - m * (scale * LOG2E))'
ab old
true
