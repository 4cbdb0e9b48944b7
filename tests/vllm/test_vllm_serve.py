"""The OpenAI-compatible server with TuttiConnector, driven over HTTP with streaming.

vLLM's server runs in its default multiprocess mode (API server, engine core with
the scheduler-side connector, worker with the worker-side connector).  TTFT is
measured as a client sees it: from sending the request to the first streamed token.
The server and the client are benchmarks/serving.py's (tutti.bench.serve).
"""
import os
import shutil

import pytest

from tutti.bench import serve
from tutti.bench.workload import Request
from tutti.vllm.runner import _stats_totals
from vllm_engine import BLOCK, engine_env


def test_serve_streams_from_stored_prefix(vtmp, model, warm_store, baseline, prompts):
    """A server started on a store written by another process streams the same text
    as a run without the connector, loading the prompt's prefix from the store."""
    path, _ = warm_store
    store = os.path.join(vtmp, "serve", "kv.img")
    os.makedirs(os.path.dirname(store), exist_ok=True)
    shutil.copy(path, store)
    stats_dir = os.path.join(vtmp, "serve", "stats")
    os.makedirs(stats_dir, exist_ok=True)
    env = engine_env(vtmp)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", TUTTI_VLLM_STATS_DIR=stats_dir)
    kv = {"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm",
          "kv_role": "kv_both", "kv_connector_extra_config": {"path": store}}
    srv = serve.Server(model=model, log_path=os.path.join(vtmp, "serve", "log.txt"), env=env,
                       kv_transfer_config=kv, block_size=BLOCK, max_model_len=4096, ready_timeout=240)
    try:
        with srv:
            res = serve.drive(srv.url, [Request("p0", 0, 0, prompts[0], 0.0)], max_tokens=8, timeout_s=120)[0]
    except serve.ServerFailed as e:
        pytest.fail(f"server did not become ready: {e}")
    ttft, ids, total = res["ttft_s"], res["ids"], res["total_s"]
    assert res["error"] is None, res["error"]
    assert ids == baseline[0]
    assert ttft is not None and 0 < ttft <= total
    # The runner's reader: *.json only (a worker stopped mid-dump leaves its .tmp behind, empty).
    loaded = sum(v.get("load_blocks", 0) for role, v in _stats_totals(stats_dir).items() if role.startswith("worker"))
    assert loaded * BLOCK >= len(prompts[0]) - BLOCK
    print(f"client-side TTFT with the prefix loaded from the store: {ttft * 1e3:.1f} ms")
