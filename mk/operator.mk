# The operator (issue: operator).  Owned by operator/.
.PHONY: crd
crd: $(STAMP)
	$(VPY) -m clef_operator.crdgen crds/clefmodel.yaml

.PHONY: crd-check
crd-check: $(STAMP)
	$(VPY) -m clef_operator.crdgen --check crds/clefmodel.yaml
