source experiments/h200_env.sh
nvidia-smi -L
gpu_tests 170 -n 6 tests/test_backend_choice.py tests/test_layouts.py tests/test_api.py
step_vs_cudnn "$OUT/step" 25 150
true
