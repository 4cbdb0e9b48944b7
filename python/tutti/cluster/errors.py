"""The cluster tier's errors live with every other one in tutti.errors (one base); kept importable here."""
from ..errors import CallTimeout, ClusterError, DescriptorError

__all__ = ["CallTimeout", "ClusterError", "DescriptorError"]
