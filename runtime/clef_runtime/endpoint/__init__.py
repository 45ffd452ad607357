"""Endpoint verification: ask the serving engine itself (`check`), through engine dialects (`dialects`), judged by the divergence rule (`judge`)."""
