# The operator (issue: operator).  Owned by operator/.
# kustomize/base carries a copy of the CRD (kustomize reads no file outside its directory).
.PHONY: crd
crd: $(STAMP)
	$(VPY) -m clef_operator.crdgen crds/clefmodel.yaml
	$(VPY) -m clef_operator.crdgen kustomize/base/clefmodel-crd.yaml

.PHONY: crd-check
crd-check: $(STAMP)
	$(VPY) -m clef_operator.crdgen --check crds/clefmodel.yaml
	$(VPY) -m clef_operator.crdgen --check kustomize/base/clefmodel-crd.yaml
