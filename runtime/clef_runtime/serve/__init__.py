"""`clef-runtime serve`: clef as an OpenAI-compatible engine, one request at a time."""
