"""Mutants for judging `clef-runtime verify` (docs/verification.md, "Mutants").

* Kernel-source mutants (`source`, `inject`, `damage`, `score`): generated mechanically from the
  Triton kernels' AST; their damage is measured by the harness's own bound; the score of verify.
* Contract mutants (`catalogue`, `triggers`, `memo`, `device_run`): hand-written wrappers,
  regression tests of verify's contract checks (written beside them, so not a score).

They live in the tests, not in the shipped fault catalogue (`clef_runtime.faults`)."""
