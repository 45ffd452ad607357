"""clef's Kubernetes operator: ClefModel → verified Deployments behind a stable Service."""

__version__ = "0.1.0"
