# `make demo` (README's first command): the homelab story on a local control plane of its own,
# from .demo/cluster (the test tier uses .cluster, so the two never meet).  It builds the cached
# control plane first where the cache lacks it.  The cluster and the operator stay up afterwards
# for a look around; `make demo-down` stops both.  devcluster/clef_devcluster/demo.py; docs/operations.md.

DEMO := CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m clef_devcluster.demo

.PHONY: demo demo-down

demo: $(STAMP)
	@$(DEMO)

demo-down: $(STAMP)
	@$(DEMO) down
