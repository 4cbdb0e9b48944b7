"""A real mooncake_master on free loopback ports for tests/cluster and tests/vllm/test_vllm_cluster.py:
tutti.cluster.local_master, with a skip (and its reason) where Mooncake is not installed."""
import pytest

from tutti.cluster.local_master import LocalMaster, free_port, master_binary

__all__ = ["Master", "free_port"]


class Master(LocalMaster):
    def __init__(self, log_dir, client_ttl: int = 2):
        if master_binary() is None:
            pytest.skip("mooncake_master not found next to this Python or on PATH")
        super().__init__(log_dir, client_ttl)
