"""The values the runtime's command lines accept, shared by the parsers (`endpoint.cli`, which
imports no torch) and the commands that check them (`goldens.make`, `serve.command`)."""

from __future__ import annotations

# `serve --dialect`: the HTTP dialects clef's own engine speaks.
SERVE_DIALECTS = ("openai", "vllm", "candle-vllm", "mistralrs")
# `--ops`: the Triton kernels or the plain-PyTorch references (`opset.get_opset`).
OPSETS = ("triton", "reference")
