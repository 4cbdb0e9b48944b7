"""Every option of kv_connector_extra_config, given hostile values: a ConfigError naming the option, never
another exception (a traceback at vLLM start-up) and never a silently accepted nonsense value."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from tutti.errors import ConfigError
from tutti.vllm.config import TuttiConfig

HOSTILE = ([1], {"a": 1}, None, -1, 1e99, "", " ", "x" * 10000, True, math.nan, math.inf, -math.inf,
           [None], ["a", 3], b"x", object(), 0, 70000, 1.5)


def _cluster_keys():
    from dataclasses import fields

    from tutti.cluster.config import ClusterConfig
    return ["cluster_" + f.name for f in fields(ClusterConfig)] + ["cluster_enable"]


@pytest.mark.parametrize("key", list(TuttiConfig.KEYS) + _cluster_keys())
def test_hostile_values_are_config_errors_naming_the_option(key):
    for bad in HOSTILE:
        try:
            c = TuttiConfig.from_extra({key: bad})
        except ConfigError as e:
            assert key in str(e), f"{key}={bad!r}: {e}"
            continue
        # Accepted: only where the value is meaningful for that option.
        got = getattr(c.cluster, key[len("cluster_"):], c.cluster) if key.startswith("cluster_") \
            else getattr(c, key)
        if key == "cluster_enable":
            continue  # a bool (checked by _bool); accepted: the ClusterConfig itself
        assert got is None or isinstance(got, (str, int, float, list)), f"{key}={bad!r} accepted as {got!r}"
        assert not (isinstance(got, float) and not math.isfinite(got)), f"{key}={bad!r} accepted as {got!r}"


def test_unknown_option_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="unknown option"):
        TuttiConfig.from_extra({"load_polcy": "all"})


def test_a_long_non_ascii_model_name_fits_the_store(tmp_path):
    """The fingerprint keeps 127 bytes of the name: 127 characters of "é" are 254 bytes, which the store
    refused ("model_id longer than 127 bytes"), so the connector could not start."""
    from tutti import Store
    from tutti.vllm.config import ModelShape

    shape = ModelShape(model_id="é" * 127 + "/x", dtype="bfloat16", n_layers=2, kv_heads=1, head_dim=64,
                       block_size=16, tp_size=1)
    fp = shape.fingerprint(0)
    assert len(fp.model_id.encode()) <= 127 and fp.model_id == "é" * 63
    Store.format([str(tmp_path / "s.img")], fp, n_slots=4)
    with Store.open([str(tmp_path / "s.img")], expect=fp) as s:
        assert s.fingerprint == fp

