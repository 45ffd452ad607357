# Container images (images/*/Dockerfile; docs/operations.md, "Images").
#
#   make images                               the operator and one runtime image per CUDA_ARCHS
#   make images IMAGE_REGISTRY=registry.homelab.lan/clef CUDA_ARCHS=sm70
#
# Needs a Docker engine with BuildKit.  clef's build machines have none (a docker client at
# most), so here the target says so and fails: the Dockerfiles are linted by
# tests/unit/test_dockerfiles.py instead.

IMAGE_REGISTRY ?= ghcr.io/riotpiao
CUDA_ARCHS ?= sm70 sm90
DOCKER ?= docker
CLEF_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

.PHONY: images image-operator image-runtime docker-check

docker-check:
	@command -v $(DOCKER) >/dev/null 2>&1 || { \
	  echo "images: cannot build here: no '$(DOCKER)' command (a Docker engine with BuildKit is needed)"; exit 3; }
	@$(DOCKER) info >/dev/null 2>&1 || { \
	  echo "images: cannot build here: '$(DOCKER) info' fails, so no Docker engine is reachable:"; \
	  $(DOCKER) info 2>&1 | grep -iE 'cannot connect|error' | head -2 | sed 's/^/  /'; \
	  echo "  (clef's build machines have no Docker engine; build on a machine that has one)"; exit 3; }

images: image-operator image-runtime

image-operator: docker-check
	DOCKER_BUILDKIT=1 $(DOCKER) build -f images/operator/Dockerfile \
	  -t $(IMAGE_REGISTRY)/clef-operator:$(CLEF_VERSION) .

image-runtime: docker-check
	@for arch in $(CUDA_ARCHS); do \
	  case $$arch in sm70|sm90) ;; *) echo "images: CUDA_ARCHS: $$arch is not one of sm70 sm90"; exit 2;; esac; \
	  echo "DOCKER_BUILDKIT=1 $(DOCKER) build -f images/runtime/Dockerfile --build-arg CUDA_ARCH=$$arch -t $(IMAGE_REGISTRY)/clef-runtime:$(CLEF_VERSION)-$$arch ."; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build -f images/runtime/Dockerfile --build-arg CUDA_ARCH=$$arch \
	    -t $(IMAGE_REGISTRY)/clef-runtime:$(CLEF_VERSION)-$$arch . || exit $$?; \
	done
