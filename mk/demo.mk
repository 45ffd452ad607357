# `make demo` (README's first command): the homelab story on a local control plane of its own,
# from .demo/cluster (the test tier uses .cluster, so the two never meet).  It builds the cached
# control plane first where the cache lacks it.  The cluster and the operator stay up afterwards
# for a look around; `make demo-down` stops both.  devcluster/clef_devcluster/demo/; docs/operations.md.

DEMO := CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m clef_devcluster.demo

.PHONY: demo demo-vllm demo-down

demo: $(STAMP)
	@$(DEMO)

# The same story with the coder on real vLLM (its CPU build, installed first by `make engine-vllm`,
# mk/engines.mk) and the decisive checkpoint (trained on first use); `make demo-down` stops it too.
# Opt-in: vLLM takes ~4 GB of RAM and 3-6 min to start on a 2-core machine.
demo-vllm: $(STAMP) engine-vllm
	@$(DEMO) --real-vllm

demo-down: $(STAMP)
	@$(DEMO) down
