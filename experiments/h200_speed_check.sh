#!/usr/bin/env bash
# Issue 7 on the H200 (device tool): golden hashes on the GPU (head_dim 64 must equal the
# record; 128 is new), the headline bench (fa2 ± compensation and cuDNN, non-causal and causal,
# compensation overhead from 20 interleaved pairs), and an Nsight Compute profile of the forward
# kernels (ours ± compensation, cuDNN) for "what limits it". One tarball back.
# Usage (repo root, on the device): CUDA_VISIBLE_DEVICES=0 bash experiments/h200_speed_check.sh "$OUT"
# device seconds: 490 (its timeouts added up; h200_instability.sh starts it only with that much left)
set -u
OUT=${1:-runs/h200}
R=/tmp/speed
mkdir -p "$OUT" $R
source "$(dirname "$0")/h200_env.sh"
timeout 150 python3 - > $R/hashes.json 2> $R/hashes.err <<'PY'
import json
from jax_flashstable import bench
got = bench.golden_hashes()
rec = json.load(open("tests/golden_hashes.json"))["gpu"]
print(json.dumps(dict(gpu=got, d64_equal_to_record={k: got[k] == v for k, v in rec.items()}), indent=1))
PY
tail -c 1500 $R/hashes.json
timeout 170 python3 -m jax_flashstable.cli bench --shapes "4,4096,16,16,128,0;4,4096,16,16,128,1" \
  --attention fa2,fa2+comp,cudnn --overhead-pairs 20 --no-hashes --out $R/headline 2>&1 \
  | grep -v "^ " | tail -14
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-not found, no profile}"
[ -n "$NCU" ] && timeout 170 "$NCU" -k regex:"flashstable|sdpa|fmha|cudnn" --launch-count 6 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  python3 experiments/05_profile_attention.py > $R/ncu.txt 2>&1
grep -E "^  [a-z_]|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Block Limit Reg|Theoretical Occ" $R/ncu.txt | head -60
tar czf "$OUT/speed.tgz" -C $R .
