"""A held-out set of realistic silent kernel bugs (mutants) for judging `clef-runtime verify`.

They live in the tests, not in the shipped fault catalogue (`clef_runtime.faults`), so verify is
judged on bugs it was not tuned to: see docs/verification.md, "Mutants"."""
