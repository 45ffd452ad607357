"""The seam between clef's operator and its runtime, kept in one place.

The operator renders the verification Job's argv and environment and parses the compact report
the Job leaves; the runtime parses that argv, reads that environment, writes that report and exits
with one of its codes.  Both sides import these names from here, so they cannot drift apart.

Standard library only: the operator image carries no torch and the runtime image no kopf, and
both carry this package.
"""
