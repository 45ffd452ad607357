"""Goldens: the bundled runtime's greedy answers to a prompt set, with their provenance
(`schema`), the prompt set (`prompts`) and the command that proves the kernels and records them
(`make`, which needs torch; the rest does not)."""

from clef_runtime.goldens.schema import (
    GOLDENS_SCHEMA_VERSION,
    GoldenPrompt,
    Goldens,
    GoldensError,
    PromptSpec,
    parse_goldens,
    read_goldens,
    write_goldens,
)

__all__ = [
    "GOLDENS_SCHEMA_VERSION",
    "GoldenPrompt",
    "Goldens",
    "GoldensError",
    "PromptSpec",
    "parse_goldens",
    "read_goldens",
    "write_goldens",
]
