# Container images (images/*/Dockerfile; docs/operations.md, "Images").
#
#   make images                     the operator image and the CPU runtime image, into .images/
#   make images CUDA_ARCHS="cpu sm90" IMAGE_REGISTRY=registry.homelab.lan/clef
#   make image-operator             the operator image alone (a few minutes)
#   make test-images                builds the operator image twice, asserts the same digest
#
# With a Docker engine (`docker info` answers) the build uses it; otherwise buildah (vfs storage,
# chroot isolation) on a Debian bookworm base built by mmdebstrap, installed from Debian when
# missing (as root).  Wheels are built on the host (hack/images.py says why).  Outputs:
# .images/NAME.oci.tar, .images/NAME.tar (docker-archive), .images/digests.json and digests.txt,
# and kustomize/overlays/pinned/ (kustomize/base with the operator pinned to the digest built).
# The one Python version is the Makefile's PYTHON (python3.11): it names the Debian base's
# package and the Dockerfiles check their base has it.

IMAGE_REGISTRY ?= ghcr.io/riotpiao
# cpu: PyPI's default torch, run on the CPU (the real-node tier); sm90: the same torch (H100/H200);
# sm70: torch from PyTorch's cu126 index (V100), which this project's machines cannot reach.
CUDA_ARCHS ?= cpu
DOCKER ?= docker
IMAGES_DIR ?= .images
IMAGE_PYTHON := $(patsubst python%,%,$(notdir $(PYTHON)))
CLEF_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGES_PY = $(PYTHON) hack/images.py build --out $(IMAGES_DIR) --pip $(UV_HOME)/bin/pip \
  --python $(IMAGE_PYTHON) --registry $(IMAGE_REGISTRY) --version $(CLEF_VERSION) --docker $(DOCKER)

.PHONY: images image-operator image-runtime images-pin test-images

images: image-operator image-runtime

image-operator: | $(UV)
	$(IMAGES_PY) --operator
	$(PYTHON) hack/images.py pin --digests $(IMAGES_DIR)/digests.json --out kustomize/overlays/pinned

image-runtime: | $(UV)
	$(IMAGES_PY) --runtime $(CUDA_ARCHS)

images-pin:
	$(PYTHON) hack/images.py pin --digests $(IMAGES_DIR)/digests.json --out kustomize/overlays/pinned

# Opt-in (not in `make test`): two builds of the operator image, the same digest.
# CLEF_IMAGES_RUNTIME=cpu adds the CPU runtime image (several GB, 11-22 min a build here, ~40 GB of disk).
test-images: $(STAMP)
	CLEF_IMAGES=1 CLEF_IMAGES_PIP=$(UV_HOME)/bin/pip $(VPY) -m pytest tests/images -q -s -m images
