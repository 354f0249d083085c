source experiments/h200_env.sh
nvidia-smi -L
gpu_tests 400 -n 4 -v tests/test_golden.py tests/test_mechanism.py tests/test_layouts.py tests/test_compensation.py
grep -E "PASSED|FAILED" $OUT/gpu_tests.log | grep -c PASSED
seq 0 11 | timeout 150 xargs -P 6 -I{} sh -c 'python3 -c "from jax_flashstable.xla_cpu import plain_dots; plain_dots(); import runpy, sys; sys.argv=[\"x\", \"{}\"]; runpy.run_path(\"experiments/results/h100-2026-12-07e-exact-max/diag_f32.py\")" 2>/dev/null' > $OUT/diag_f32.jsonl
wc -l $OUT/diag_f32.jsonl
python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/diag_f32.jsonl"):
  d = json.loads(line)
  print(d["case"], "lse", "%.2g/%.2g" % (d["lse_err"], d["lse_ulp"]), " ".join("%s %.2f%s" % (t, r["ratio"], "" if r["ok"] else "!") for t, r in d["gpu"].items()))
PY
