# The real-node tier (docs/local-cluster.md, "A real node"): the local control plane plus a real
# kubelet, containerd and Debian's runc on this host, and clef's images run on it.  Opt-in, not
# part of `make test`: it runs as root, starts daemons and changes host state (sysctls, cgroups,
# mounts, a bridge, one iptables rule), all of it restored at the end and checked.
#
#   make test-real        host packages, the node's binaries, the operator image (`make
#                         image-operator`) and the CPU runtime image (`make image-runtime`),
#                         then tests/realnode with CLEF_REAL_NODE=1
#   make test-real REUSE_RUNTIME_IMAGE=1
#                         the same with the runtime image already in .images/ (it takes 11 to
#                         22 min to build here; digests.json names the commit it was built from)
#   make node-build       only the node's binaries (kubelet, containerd, CNI plugins, pause)

REAL_NODE_PACKAGES := runc iptables iproute2 umoci skopeo mmdebstrap
IMAGES_DIR ?= .images

.PHONY: node-build real-node-deps test-real

node-build:
	CLEF_CACHE=$(CLEF_CACHE) bash hack/cluster/build.sh node

# Debian's packages, installed only when one is missing (nothing is kept across machines).
real-node-deps:
	@missing=$$(for p in $(REAL_NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "test-real: installing $$missing"; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; \
	fi

test-real: $(STAMP) real-node-deps
	$(CLUSTER) build
	CLEF_CACHE=$(CLEF_CACHE) bash hack/cluster/build.sh node
	@# Always rebuilt (reproducible, ~2 min): the tier tests this checkout's operator, never an
	@# older image left in $(IMAGES_DIR).
	$(MAKE) --no-print-directory image-operator
	$(if $(filter 1,$(REUSE_RUNTIME_IMAGE)),@echo "test-real: reusing the runtime image in $(IMAGES_DIR) (REUSE_RUNTIME_IMAGE=1)",$(MAKE) --no-print-directory image-runtime CUDA_ARCHS=cpu)
	CLEF_REAL_NODE=1 CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m pytest tests/realnode -q -rA --durations=0
