# Benchmarks (`clef-runtime bench`, docs/performance.md).
#
# bench-wheels: the wheels the H200 device image lacks, for Python 3.12 / x86-64, into the ignored
# .whl/ folder that travels to the device (carry .whl).  flash-linear-attention 0.6.0 is two pure-
# Python wheels: fla-core (ops, modules) and flash-linear-attention (layers, models).  Everything
# they import is already in the device image (torch, triton, einops, transformers, packaging), so
# nothing else is fetched.  One version of each: older FLA wheels in .whl/ are removed first.
#
# bench-flashqla: FlashQLA and the four packages it needs that the device image lacks, unpacked and
# packed into one ignored .whlx/pk.tar.xz (~46 MB, with .whl under a device call's 64 MiB carry;
# the wheels themselves are ~80 MB).  z3-solver's copy of its command-line binary is dropped (the
# package loads libz3 from z3/lib).  On the device the archive is untarred onto PYTHONPATH.

FLA_VERSION := 0.6.0
BENCH_WHEEL_DIR := .whl
BENCH_PIP ?= python3 -m pip
BENCH_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64

FLASHQLA_WHEELS := flash-qla==0.1.3 tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 \
  z3-solver==4.15.4.0
FLASHQLA_DIR := .whlx

.PHONY: bench-wheels bench-flashqla bench bench-quick

bench-wheels:
	@mkdir -p $(BENCH_WHEEL_DIR)
	rm -f $(BENCH_WHEEL_DIR)/flash_linear_attention-*.whl $(BENCH_WHEEL_DIR)/fla_core-*.whl
	$(BENCH_PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(BENCH_PLATFORMS) -d $(BENCH_WHEEL_DIR) \
	  flash-linear-attention==$(FLA_VERSION) fla-core==$(FLA_VERSION)
	@ls -1 $(BENCH_WHEEL_DIR)/flash_linear_attention-$(FLA_VERSION)-*.whl $(BENCH_WHEEL_DIR)/fla_core-$(FLA_VERSION)-*.whl

bench-flashqla:
	rm -rf $(FLASHQLA_DIR)/dl $(FLASHQLA_DIR)/pk && mkdir -p $(FLASHQLA_DIR)/dl $(FLASHQLA_DIR)/pk
	$(BENCH_PIP) download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(BENCH_PLATFORMS) --platform manylinux_2_24_x86_64 -d $(FLASHQLA_DIR)/dl $(FLASHQLA_WHEELS)
	python3 -c 'import os, sys, zipfile; [os.chmod(z.extract(i, sys.argv[1]), (i.external_attr >> 16) & 0o777 or 0o644) \
	  for w in sys.argv[2:] for z in [zipfile.ZipFile(w)] for i in z.infolist() if not i.is_dir()]' \
	  $(FLASHQLA_DIR)/pk $(FLASHQLA_DIR)/dl/*.whl
	rm -rf $(FLASHQLA_DIR)/pk/z3_solver-*.data
	tar -C $(FLASHQLA_DIR)/pk -cf - . | xz -T0 -6 > $(FLASHQLA_DIR)/pk.tar.xz
	rm -rf $(FLASHQLA_DIR)/dl $(FLASHQLA_DIR)/pk
	@ls -l $(FLASHQLA_DIR)/pk.tar.xz

# On a machine with a CUDA GPU (and FLA installed, or --no-fla): the full table, results in .bench/.
bench: $(STAMP)
	$(VPY) -m clef_runtime bench --json .bench/bench.json

bench-quick: $(STAMP)
	$(VPY) -m clef_runtime bench --quick --json .bench/bench-quick.json
