"""The engines the tests start are forks of a zygote that imported vLLM once (tutti.vllm.zygote): each
is still its own process, a run past its timeout is killed, and without a zygote launch() starts a fresh
interpreter."""
import os
import subprocess
import time

import pytest

from tutti.vllm import runner
from vllm_engine import run_engine


def test_runs_are_forks_of_the_zygote_each_its_own_process(vtmp, zygote, model, prompts, baseline):
    if zygote is None:
        pytest.skip("TUTTI_TEST_ZYGOTE=0: engines start as fresh interpreters")
    a = run_engine(vtmp, "zygote-a", model=model, prompts=prompts[:1], connector="none")
    b = run_engine(vtmp, "zygote-b", model=model, prompts=prompts[:1], connector="none")
    assert a["outputs"] == b["outputs"] == baseline[:1]
    assert a["pid"] != b["pid"] and a["ppid"] == b["ppid"] != os.getpid()  # siblings, children of the zygote


def test_a_run_past_its_timeout_is_killed_and_the_zygote_goes_on(vtmp, zygote, model, prompts):
    if zygote is None:
        pytest.skip("TUTTI_TEST_ZYGOTE=0: engines start as fresh interpreters")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_engine(vtmp, "zygote-timeout", model=model, prompts=prompts * 20, connector="none",
                   max_tokens=2000, timeout=4)
    assert time.monotonic() - t0 < 10
    assert run_engine(vtmp, "zygote-after", model=model, prompts=prompts[:1], connector="none")["outputs"]


def test_without_a_zygote_launch_uses_a_fresh_interpreter(tmp_path):
    assert runner._via_zygote(None, "s", "o", "l", {}, 5) is None
    assert runner._via_zygote(str(tmp_path / "no.sock"), "s", "o", "l", {}, 5) is None
