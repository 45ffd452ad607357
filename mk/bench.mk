# Benchmarks (`clef-runtime bench`, docs/performance.md).
#
# bench-wheels: the wheels the H200 device image lacks, for Python 3.12 / x86-64, into the ignored
# .whl/ folder that travels to the device (carry .whl).  flash-linear-attention 0.6.0 is two pure-
# Python wheels: fla-core (ops, modules) and flash-linear-attention (layers, models).  Everything
# they import is already in the device image (torch, triton, einops, transformers, packaging), so
# nothing else is fetched.  One version of each: older FLA wheels in .whl/ are removed first.

FLA_VERSION := 0.6.0
BENCH_WHEEL_DIR := .whl
BENCH_PIP ?= python3 -m pip
BENCH_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64

.PHONY: bench-wheels bench bench-quick

bench-wheels:
	@mkdir -p $(BENCH_WHEEL_DIR)
	rm -f $(BENCH_WHEEL_DIR)/flash_linear_attention-*.whl $(BENCH_WHEEL_DIR)/fla_core-*.whl
	$(BENCH_PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(BENCH_PLATFORMS) -d $(BENCH_WHEEL_DIR) \
	  flash-linear-attention==$(FLA_VERSION) fla-core==$(FLA_VERSION)
	@ls -1 $(BENCH_WHEEL_DIR)/flash_linear_attention-$(FLA_VERSION)-*.whl $(BENCH_WHEEL_DIR)/fla_core-$(FLA_VERSION)-*.whl

# On a machine with a CUDA GPU (and FLA installed, or --no-fla): the full table, results in .bench/.
bench: $(STAMP)
	$(VPY) -m clef_runtime bench --json .bench/bench.json

bench-quick: $(STAMP)
	$(VPY) -m clef_runtime bench --quick --json .bench/bench-quick.json
