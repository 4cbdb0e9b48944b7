"""TuttiConnector: vLLM's KV connector backed by a Tutti store.

    from vllm import LLM
    from vllm.config import KVTransferConfig
    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
        kv_connector_extra_config={"path": "/var/lib/tutti/kv.img", "capacity": "64GiB"}))

vLLM is imported only when the connector class is first used, so ``import tutti``
and ``tutti.vllm.config`` / ``tutti.vllm.layout`` work without it.  See docs/vllm.md.
"""

__all__ = ["TuttiConnector"]


def __getattr__(name):
    if name == "TuttiConnector":
        from .connector import TuttiConnector
        return TuttiConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
