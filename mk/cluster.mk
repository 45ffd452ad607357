# The local control plane (issue: local cluster).  Owned by tests/cluster/harness.
.PHONY: test-cluster
test-cluster: $(STAMP)
	$(VPY) -m pytest tests/cluster -q
