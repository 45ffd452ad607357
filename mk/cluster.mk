# The local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and
# the verification runner as local processes on 127.0.0.1; no Docker).  docs/local-cluster.md.
# Binaries are built once from the pins in hack/cluster/versions.env into $(CLEF_CACHE).

CLUSTER := CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m clef_devcluster

.PHONY: cluster-build cluster-up cluster-down cluster-status cluster-env kind-up kind-down test-cluster

cluster-build: $(STAMP)
	$(CLUSTER) build

cluster-up: $(STAMP)
	$(CLUSTER) up

cluster-down: $(STAMP)
	$(CLUSTER) down

cluster-status: $(STAMP)
	$(CLUSTER) status

cluster-env: $(STAMP)
	@$(CLUSTER) env

# The cluster tier.  Without CLEF_KUBECONFIG it runs against the local control plane, building it
# first when the cache lacks it (where Go is missing the build prints why and the tests skip).
# The control plane's binaries (kubectl among them, which the kustomize unit tests use too), built
# into the cache when it lacks them; `make test` runs this before any tier.
.PHONY: cluster-build-if-possible
cluster-build-if-possible: $(STAMP)
	@if [ -z "$${CLEF_KUBECONFIG:-}" ]; then $(CLUSTER) build --if-possible; fi

# Two pytest workers, each with its own local control plane (tests/cluster/conftest.py:
# state_dir), a test file to a worker: 13.5 min instead of ~22 on two cores.  CLUSTER_WORKERS=1
# runs them on one.
CLUSTER_WORKERS ?= 2
test-cluster: cluster-build-if-possible
	CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m pytest tests/cluster -q -n $(CLUSTER_WORKERS) --dist loadfile \
	  --durations=25 --durations-min=10

# Machines with Docker and kind only (untested on the Docker-less build machines): a kind cluster
# with kwok's GPU nodes, the RuntimeClass, the image table and the runner added from this host.
# Then: CLEF_KUBECONFIG=.cluster/kind/kubeconfig make test-cluster
KIND ?= kind
kind-up: $(STAMP)
	@command -v $(KIND) >/dev/null || { echo "kind-up: needs kind (https://kind.sigs.k8s.io) and Docker"; exit 3; }
	@mkdir -p .cluster/kind
	$(KIND) get clusters | grep -qx clef || $(KIND) create cluster --name clef
	$(KIND) get kubeconfig --name clef > .cluster/kind/kubeconfig
	$(CLUSTER) build
	$(CLUSTER) --state-dir .cluster/kind up --attach .cluster/kind/kubeconfig

kind-down: $(STAMP)
	$(CLUSTER) --state-dir .cluster/kind down
	$(KIND) delete cluster --name clef

# The operator at scale on a control plane of its own (.load/cluster): the plain-Deployment floor,
# LOAD_MODELS ClefModels to Ready, idle request rate from the audit log, RSS, CPU, events; a table
# and .load/result.json (docs/performance.md, "Operator at scale").  LOAD_ARGS: more flags, e.g.
# "--cycles 2" or "--verified 20 --verify-gpus 2".
LOAD_MODELS ?= 1000
.PHONY: load-test
load-test: $(STAMP)
	CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m clef_devcluster.load --models $(LOAD_MODELS) $(LOAD_ARGS)
