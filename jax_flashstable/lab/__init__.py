"""The numerics lab: accuracy against FP64 (`accuracy`), deviation and bias benchmarks (`numerics_lab`), PyTorch cross-checks (`crosscheck`, `dumpfile`)."""
