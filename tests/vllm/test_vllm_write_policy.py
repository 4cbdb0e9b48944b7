"""Reads first, through real vLLM (CPU build): both write policies give the same outputs and stored
bytes; only slack keeps reads and writes apart (the worker-level tests: tests/test_worker_write_policy.py).
"""
import os

from tutti import PagedBuffer, Store


def stored_blocks(path):
    """{16-byte key: block bytes} of every block committed in the store at ``path``."""
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        keyslots = sorted(s.committed().items())
        buf = PagedBuffer.for_geometry(s.geometry, len(keyslots))
        txn = s.read([slot for _, slot in keyslots])
        for layer in range(s.geometry.n_layers):
            txn.layer(layer, buf, range(len(keyslots)))
        assert txn.finish() == [0] * len(keyslots)
        return {k: buf.contiguous_block(i) for i, (k, _) in enumerate(keyslots)}


def test_engine_outputs_and_stores_equal_in_both_policies(vtmp, model, warm_store, prompts,
                                                         vocab, block):
    """Real vLLM: prompts whose prefix is stored and whose tails are new load the prefix
    and save the tails' blocks in the same step.  Outputs and the stored bytes are the same
    under both policies; with slack no read and write were ever in flight together, with
    eager they were."""
    import random
    import shutil

    from conftest import PREFIX
    from vllm_engine import run_engine, worker_stats

    rng = random.Random(11)
    fresh = [prompts[0][:PREFIX] + [rng.randrange(3, vocab) for _ in range(n)] for n in (70, 100)]
    res, stores = {}, {}
    for policy in ("slack", "eager"):
        stores[policy] = path = os.path.join(vtmp, "policy", f"{policy}.img")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copy(warm_store[0], path)
        r = run_engine(vtmp, f"policy-{policy}", model=model, prompts=fresh, store=path,
                       max_tokens=4, extra={"write_policy": policy})
        res[policy] = r["outputs"], worker_stats(r)
        work = res[policy][1]
        assert work["load_blocks"] * block >= PREFIX  # the prefix came from the store ...
        assert work["save_blocks"] == 70 // block + 100 // block  # ... the tails' blocks went
    (out_s, slack), (out_e, eager) = res["slack"], res["eager"]
    assert out_s == out_e
    assert stored_blocks(stores["slack"]) == stored_blocks(stores["eager"])
    assert slack["writes_deferred"] > 0 and slack.get("rw_overlap_s", 0) == 0
    assert eager.get("writes_deferred", 0) == 0 and eager["rw_overlap_s"] > 0
