"""clef's GDN runtime: Triton kernels, plain-PyTorch references, the hybrid model and `verify`."""

__version__ = "0.1.0"
