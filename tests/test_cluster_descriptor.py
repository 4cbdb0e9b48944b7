"""Location descriptors and cluster options are checked before they are trusted (no Mooncake needed)."""
import pytest

from tutti.cluster import ClusterConfig, ClusterError, Descriptor, DescriptorError
from tutti.cluster.keys import block_name, fingerprint_id
from tutti.model import Fingerprint, Geometry

TINY = Fingerprint(model_id="tests/tiny", dtype="float16", n_layers=4, kv_heads=2, head_dim=64, block_size=16)

GEO = Geometry(n_layers=4, n_spans=2, span_bytes=4096, obj_stride=4096, n_members=1, stripe_objs=256,
               n_slots=16, data_off=1 << 20)


def desc(**kw):
    base = dict(fp_id=fingerprint_id(TINY), key=bytes(range(16)), store_uuid="12345678-1234-5678-1234-567812345678",
                endpoint="127.0.0.1:17001", slot=3, gen=7, data_sum=0xDEADBEEF, block_bytes=8 * 4096,
                span_bytes=4096, n_objs=8)
    base.update(kw)
    return Descriptor(**base)


def test_round_trip():
    d = desc()
    assert Descriptor.decode(d.encode()) == d
    d.check_against(fingerprint_id(TINY), bytes(range(16)), GEO)


@pytest.mark.parametrize("mangle, reason", [
    (lambda v: v[:-1], "bytes; its header says"),
    (lambda v: v + b"x", "bytes; its header says"),
    (lambda v: v[:10], "shorter than its header"),
    (lambda v: b"XXXX" + v[4:], "magic"),
    (lambda v: v[:4] + b"\x02\x00" + v[6:], "version 2"),
    (lambda v: v[:60] + bytes([v[60] ^ 0x80]) + v[61:], "fails its check"),
    (lambda v: v[:-3] + bytes([v[-3] ^ 1]) + v[-2:], "fails its check"),
])
def test_damaged_values_are_refused(mangle, reason):
    with pytest.raises(DescriptorError, match=reason):
        Descriptor.decode(mangle(desc().encode()))


def test_inconsistent_geometry_is_refused():
    with pytest.raises(DescriptorError, match="inconsistent"):
        Descriptor.decode(desc(block_bytes=123).encode())


def test_another_model_key_or_shape_is_refused():
    d = desc()
    other = fingerprint_id(TINY.__class__(**{**TINY.to_dict(), "tp_rank": 1, "tp_size": 2}))
    with pytest.raises(DescriptorError, match="another model or TP rank"):
        d.check_against(other, d.key, GEO)
    with pytest.raises(DescriptorError, match="another block key"):
        d.check_against(d.fp_id, bytes(16), GEO)
    with pytest.raises(DescriptorError, match="this store's is"):
        d.check_against(d.fp_id, d.key, Geometry(**{**GEO.__dict__, "span_bytes": 2048}))


def test_names_carry_the_model_and_rank():
    fp1 = fingerprint_id(TINY)
    fp2 = fingerprint_id(TINY.__class__(**{**TINY.to_dict(), "model_id": "other"}))
    assert fp1 != fp2 and block_name(fp1, b"k" * 16) != block_name(fp2, b"k" * 16)


def test_options_from_extra_config():
    cfg = ClusterConfig.from_extra_config({"path": "/x", "cluster_master": "10.0.0.1:50051",
                                           "cluster_port": "17005", "cluster_fetch_timeout_s": 3})
    assert cfg.master == "10.0.0.1:50051" and cfg.port == 17005 and cfg.fetch_timeout_s == 3.0
    assert cfg.endpoint == "127.0.0.1:17005"
    with pytest.raises(ClusterError, match="unknown cluster option 'cluster_mastr'"):
        ClusterConfig.from_extra_config({"cluster_mastr": "x"})
    with pytest.raises(ClusterError, match="not a int"):
        ClusterConfig.from_extra_config({"cluster_port": "many"})
    with pytest.raises(ClusterError, match="bounded"):
        ClusterConfig.from_extra_config({"cluster_call_timeout_s": 0})
    assert ClusterConfig.from_extra_config({"cluster_peer_quarantine_s": 0}).peer_quarantine_s == 0
    for bad in (-1, 3601):
        with pytest.raises(ClusterError, match="cluster_peer_quarantine_s"):
            ClusterConfig.from_extra_config({"cluster_peer_quarantine_s": bad})


def test_connector_takes_cluster_keys_and_refuses_typos_in_one_line():
    """The vLLM connector's config: cluster_* keys are checked through ClusterConfig; without them no
    cluster (and no Mooncake import); ports for the scheduler's client must exist."""
    import subprocess
    import sys

    from tutti.errors import ConfigError
    from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET, check_ports, scheduler_config, worker_config
    from tutti.vllm.config import TuttiConfig

    assert TuttiConfig.from_extra({"capacity": "1GiB"}).cluster is None
    c = TuttiConfig.from_extra({"cluster_master": "10.0.0.1:50051", "cluster_port": 18000}).cluster
    assert c.master == "10.0.0.1:50051" and c.port == 18000
    assert worker_config(c, 3).port == 18003
    assert scheduler_config(c).port == 18000 + SCHEDULER_PORT_OFFSET and scheduler_config(c).index_bytes == 0
    assert TuttiConfig.from_extra({"cluster_enable": False, "cluster_port": 18000}).cluster is None
    for bad, why in (({"cluster_mastr": "x"}, "unknown cluster option 'cluster_mastr'"),
                     ({"cluster_port": 0}, "not a TCP port"),
                     ({"cluster_enable": "maybe"}, "cluster_enable")):
        with pytest.raises(ConfigError, match=why) as e:
            TuttiConfig.from_extra(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ClusterError, match="cluster_port"):
        check_ports(ClusterConfig(port=65000), 1)
    code = ("import sys; from tutti.vllm.config import TuttiConfig; TuttiConfig.from_extra({'path': '/x'}); "
            "print(any(m.startswith('mooncake') for m in sys.modules))")
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"


def test_inflight_batches_and_staging_are_bounded():
    from tutti.cluster.config import MAX_INFLIGHT, MAX_SEND_THREADS, check_staging

    assert ClusterConfig.from_extra_config({"cluster_inflight_batches": "3"}).inflight_batches == 3
    for bad in (0, -1, MAX_INFLIGHT + 1, 1.5, True, "two"):
        with pytest.raises(ClusterError, match="cluster_inflight_batches"):
            ClusterConfig.from_extra_config({"cluster_inflight_batches": bad})
    cfg = ClusterConfig(batch_blocks=16, inflight_batches=3, send_threads=2)
    assert cfg.serve_slots == 3  # one being read, two being sent
    assert check_staging(cfg, 1 << 20) == (3 + 3) * 16 * (1 << 20) + 4096
    assert 1 <= ClusterConfig().sends <= 3  # auto: one send per 4 CPUs, 1 to 3
    for bad in (-1, MAX_SEND_THREADS + 1, 1.5, "many"):
        with pytest.raises(ClusterError, match="cluster_send_threads"):
            ClusterConfig.from_extra_config({"cluster_send_threads": bad})
    # Hundreds of GiB of staging (4096 blocks x 64 batches x 2 MiB) is refused, naming the keys to lower.
    with pytest.raises(ClusterError, match="cluster_batch_blocks, cluster_inflight_batches"):
        check_staging(ClusterConfig(batch_blocks=4096, inflight_batches=MAX_INFLIGHT), 2 << 20)


def test_bounded_calls_run_at_once_and_only_late_ones_count_as_stuck():
    import threading
    import time

    from tutti.cluster.bounded import Bounded, CallTimeout

    b = Bounded(max_stuck=2)
    out = []
    ts = [threading.Thread(target=lambda i=i: out.append(b.call(5, time.sleep, 0.3) or i)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(out) == list(range(8)) and b.stuck == 0   # 8 calls at once: none refused
    release = threading.Event()
    for _ in range(2):
        with pytest.raises(CallTimeout, match="no answer"):
            b.call(0.05, release.wait, 10)
    assert b.stuck == 2
    with pytest.raises(CallTimeout, match="still stuck"):
        b.call(5, int)
    release.set()
    deadline = time.monotonic() + 5
    while b.stuck:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert b.call(5, int, "7") == 7


def test_a_batchs_good_blocks_go_as_one_transfer_per_run():
    from tutti.cluster.transfer import _runs
    assert _runs([0, 1, 2, 3], 1000, 5000, 10) == ([1000], [5000], [40])
    assert _runs([0, 2, 3, 5], 1000, 5000, 10) == ([1000, 1020, 1050], [5000, 5020, 5050], [10, 20, 10])
    assert _runs([4], 0, 0, 8) == ([32], [32], [8])
