"""The cluster tier: a block one node's store holds is served to every node, through Mooncake.

``ClusterNode(store, ClusterConfig(...))`` publishes the store's blocks into Mooncake's master (one
location descriptor per block, in the node's own segment), serves peers' fetches from the store, and
fetches from peers with the owner's committed XXH3 checksum verified end to end.  docs/cluster.md says
how to run N nodes and what ran where.  Needs ``pip install 'tutti[cluster]'`` (Mooncake).
"""
from .config import ClusterConfig
from .descriptor import Descriptor
from .errors import ClusterError, DescriptorError
from .node import ClusterNode

__all__ = ["ClusterConfig", "ClusterNode", "ClusterError", "Descriptor", "DescriptorError"]
