# 2026-12-07 (second): P̄ = 2^((S − m)·k) with S rounded on its own (mul.rn) in the forward,
# against the FMA 2^(S·k − m·k): GPU tests, then experiment 11's default, new and old
source experiments/h200_env.sh
nvidia-smi -L
gpu_tests 300 -n 6 tests/test_mechanism.py tests/test_mosaic_gpu.py tests/test_compensation.py tests/test_golden.py
ab() {  # label
  timeout 65 python3 experiments/11_mgpu_forward_ab.py --pairs 15 --out "$OUT/ab_$1.txt" bk=64 > "$OUT/ab_$1.log" 2>&1
  timeout 50 python3 experiments/11_mgpu_forward_ab.py --pairs 15 --causal --shape 16,1024,12,12,64 --out "$OUT/ab_$1.txt" bk=64 >> "$OUT/ab_$1.log" 2>&1
  echo "$1: exit $?"; grep -E "cudnn|bk=" "$OUT/ab_$1.txt"
}
ab new
set_line pallas_kernels/policy.py '      return jnp.exp2(self.max_gap(s, m, rounded) * (scale * LOG2E))' '      return jnp.exp2(s * (scale * LOG2E) - m * (scale * LOG2E))'
set_line pallas_kernels/forward_mgpu.py '      if opts.rounded_scores:  # S − m exactly 0 at the max: P̄ = 1 there (`rounded_scores`)' '      if False:'
ab old
true
