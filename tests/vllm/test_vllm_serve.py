"""The OpenAI-compatible server with TuttiConnector, driven over HTTP with streaming.

vLLM's server runs in its default multiprocess mode (API server, engine core with
the scheduler-side connector, worker with the worker-side connector).  TTFT is
measured as a client sees it: from sending the request to the first streamed token.
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from vllm_engine import BLOCK, engine_env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(1)
    return False


def _stream_completion(port, prompt_ids, max_tokens):
    """(ttft seconds, generated token ids, total seconds) of one streamed greedy completion."""
    body = json.dumps({"model": "m", "prompt": prompt_ids, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True, "echo": False,
                       "return_token_ids": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()[:500]
    ttft, ids, chunks = None, [], []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        choice = json.loads(line[5:])["choices"][0]
        chunks.append(choice)
        new = choice.get("token_ids") or []
        if new and ttft is None:
            ttft = time.perf_counter() - t0
        ids += new
    return ttft, ids, time.perf_counter() - t0, chunks


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
    port = _free_port()
    kv = {"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm",
          "kv_role": "kv_both", "kv_connector_extra_config": {"path": store}}
    log_path = os.path.join(vtmp, "serve", "log.txt")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
             "--block-size", str(BLOCK), "--max-model-len", "4096", "--enforce-eager",
             "--kv-transfer-config", json.dumps(kv)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        if not _wait_ready(port, proc, timeout=240):
            with open(log_path) as f:
                pytest.fail(f"server did not become ready; log tail:\n{f.read()[-4000:]}")
        ttft, ids, total, chunks = _stream_completion(port, prompts[0], max_tokens=8)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert ids == baseline[0], chunks[:3]
    assert ttft is not None and 0 < ttft <= total
    loaded = 0
    for name in os.listdir(stats_dir):
        if name.startswith("worker"):
            with open(os.path.join(stats_dir, name)) as f:
                loaded += json.load(f).get("load_blocks", 0)
    assert loaded * BLOCK >= len(prompts[0]) - BLOCK
    print(f"client-side TTFT with the prefix loaded from the store: {ttft * 1e3:.1f} ms")
