"""Stride-derived memory maps and option parsing (no engine: fast)."""
import pytest

from tutti.vllm.config import ConfigError, TuttiConfig, parse_size
from tutti.vllm.layout import LayoutError, layer_layout


def _contig(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def test_cpu_layout_is_one_span_per_block():
    # vLLM CPU attention: [num_blocks, kv_heads, block_size, 2*head_dim]
    shape = (100, 2, 32, 128)
    lay = layer_layout(shape, _contig(shape), 2, 4096, num_blocks=100)
    assert lay.bases == (4096,)
    assert lay.span_bytes == lay.block_stride == 2 * 32 * 128 * 2


def test_flash_attn_layout_is_two_spans():
    # flash-attn: [2, num_blocks, block_size, kv_heads, head_dim]: K and V apart
    shape = (2, 100, 16, 8, 128)
    lay = layer_layout(shape, _contig(shape), 2, 0, num_blocks=100)
    span = 16 * 8 * 128 * 2
    assert lay.bases == (0, 100 * span)
    assert lay.span_bytes == lay.block_stride == span


def test_permuted_layout_follows_strides():
    # logical [2, nb, bs, heads, dim] stored as [nb, 2, heads, bs, dim] (HND, K/V inside a block)
    nb, bs, h, d = 10, 16, 4, 64
    phys = _contig((nb, 2, h, bs, d))   # strides of (nb, 2, h, bs, dim)
    strides = (phys[1], phys[0], phys[3], phys[2], phys[4])
    lay = layer_layout((2, nb, bs, h, d), strides, 2, 0, num_blocks=nb)
    # K and V of a block fill one dense region: one span, whatever the logical order
    assert lay.bases == (0,)
    assert lay.span_bytes == lay.block_stride == 2 * bs * h * d * 2


def test_padded_blocks_keep_their_stride():
    # [nb, 2, bs, h, d] with each block padded to a larger stride: one span, stride > span
    nb, bs, h, d = 10, 16, 2, 64
    span = 2 * bs * h * d
    strides = (span + 256, bs * h * d, h * d, d, 1)
    lay = layer_layout((nb, 2, bs, h, d), strides, 2, 0, num_blocks=nb)
    assert lay.span_bytes == span * 2 and lay.block_stride == (span + 256) * 2


def test_non_dense_block_is_refused():
    shape = (10, 4, 64)
    strides = (512, 128, 2)  # every other element: not dense
    with pytest.raises(LayoutError):
        layer_layout(shape, strides, 2, 0, num_blocks=10)


def test_config_defaults_and_sizes():
    c = TuttiConfig.from_extra({"path": "/x/kv.img", "capacity": "2GiB", "verify": "true"})
    assert c.path == ["/x/kv.img"] and c.capacity == 2 << 30 and c.verify is True
    assert parse_size("512 MiB") == 512 << 20 and parse_size(4096) == 4096
    assert c.member_paths("m", 1, 2) == ["/x/kv.img.rank1"]
    c2 = TuttiConfig.from_extra({"path": ["/a/{rank}.img", "/b/{rank}.img"]})
    assert c2.member_paths("m", 3, 4) == ["/a/3.img", "/b/3.img"]


@pytest.mark.parametrize("extra, word", [
    ({"pth": "/x"}, "unknown option"),
    ({"capacity": "lots"}, "capacity"),
    ({"capacity": 0}, "capacity"),
    ({"engine": "spdk"}, "engine"),
    ({"verify": "maybe"}, "verify"),
    ({"load_failure_policy": "ignore"}, "load_failure_policy"),
    ({"lookahead_layers": 0}, "lookahead_layers"),
])
def test_bad_options_are_named(extra, word):
    with pytest.raises(ConfigError, match=word):
        TuttiConfig.from_extra(extra)


def test_stats_aggregate_reduce_and_prometheus():
    from tutti.vllm.stats import TuttiStats, prometheus_text
    a, b = TuttiStats(), TuttiStats()
    a.add(load_bytes=10**9, load_s=0.25, hit_tokens=96, query_tokens=128)
    b.add(load_bytes=10**9, load_s=0.25, corrupt_blocks=1)
    r = a.aggregate(b).reduce()
    assert r["load_GBps"] == 4.0 and r["hit_rate"] == 0.75 and r["corrupt_blocks"] == 1
    text = prometheus_text(a.data)
    assert "# TYPE tutti_vllm_load_seconds counter" in text
    assert "tutti_vllm_load_seconds_total 0.5" in text
    assert "tutti_vllm_hit_tokens_total 96" in text


def test_budget_gauges_keep_the_latest_value_and_reach_prometheus():
    import functools
    from types import SimpleNamespace as NS

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from tutti.vllm.stats import TuttiStats, build_prom_metrics, prometheus_text
    a, b = TuttiStats(), TuttiStats()
    a.add(save_skipped=3)
    a.set(write_budget_bytes_per_day=100, write_budget_left_bytes=40)
    b.set(write_budget_bytes_per_day=100, write_budget_left_bytes=-5)
    assert b.is_empty()  # gauges alone are no news
    a.aggregate(b)
    assert a.data["write_budget_left_bytes"] == -5 and a.data["save_skipped"] == 3
    assert "tutti_vllm_write_budget_left_bytes -5" in prometheus_text(a.data)
    reg = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=reg) for cls in (Counter, Gauge, Histogram)}
    prom = build_prom_metrics(NS(kv_transfer_config=None), types, ["engine"], {0: ["0"]})
    prom.observe(a.data, 0)
    assert reg.get_sample_value("tutti:save_skipped_total", {"engine": "0"}) == 3
    assert reg.get_sample_value("tutti:write_budget_left_bytes", {"engine": "0"}) == -5
