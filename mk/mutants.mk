# Kernel-source mutants (docs/verification.md, "Kernel-source mutants"): a seeded sample of the
# mechanically generated mutants of the Triton kernels, judged at f16, bf16 and f32 on the CPU
# (damage against the reference by the harness's own bound, then verify's default Job on each
# damaging one).  Opt-in: it takes tens of minutes under the interpreter.  `make test` runs a
# three-mutant sample (tests/runtime/test_source_mutants.py).

MUTANTS_SAMPLE ?= 100
MUTANTS_DTYPES ?= f16,bf16,f32
MUTANTS_JSON ?= docs/data/mutants-source.json

.PHONY: mutants
mutants: $(STAMP)
	TRITON_INTERPRET=1 PYTHONPATH=tests/runtime $(VPY) -m mutants.score --sample $(MUTANTS_SAMPLE) --dtypes $(MUTANTS_DTYPES) \
	  --json $(MUTANTS_JSON)
