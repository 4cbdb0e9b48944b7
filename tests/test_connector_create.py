"""The connector creating a missing store: a store the file system cannot reserve stops the engine's start
with the error and the connector's own ways out (its keys, not the CLI's flags)."""
import errno
import logging
from types import SimpleNamespace

import pytest

from tutti import Store, TuttiError
from tutti.vllm import datapath
from tutti.vllm.config import TuttiConfig

LAYOUT = SimpleNamespace(n_layers=2, n_spans=2, span_bytes=4096)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EOPNOTSUPP])
def test_a_store_that_cannot_be_reserved_names_the_connector_keys(tmp_path, monkeypatch, err):
    def refuse(*a, **kw):
        raise TuttiError(err, "kv.img: not enough space for 4096 bytes")

    monkeypatch.setattr(Store, "format", refuse)
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "capacity": "1GiB"})
    with pytest.raises(TuttiError) as e:
        datapath._create_if_missing(cfg, cfg.path, None, LAYOUT, logging.getLogger("t"))
    assert e.value.errno == err
    assert "cannot create the store" in str(e.value) and "preallocate" in str(e.value)
    assert "kv.img: not enough space" in str(e.value)
    # Asked for a sparse file: the error is the library's own, unchanged.
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "preallocate": False})
    with pytest.raises(TuttiError) as e:
        datapath._create_if_missing(cfg, cfg.path, None, LAYOUT, logging.getLogger("t"))
    assert "preallocate" not in str(e.value)


def test_a_real_refusal_reaches_the_connector(tmp_path):
    """No mock: a capacity beyond the file system's free space, reserved at create."""
    import shutil
    free = shutil.disk_usage(tmp_path).free
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "capacity": str(free + (1 << 30))})
    from tutti import Fingerprint
    fp = Fingerprint(model_id="t", dtype="bfloat16", n_layers=2, kv_heads=1, head_dim=64, block_size=16)
    layout = SimpleNamespace(n_layers=2, n_spans=2, span_bytes=16 * 64 * 2)
    with pytest.raises(TuttiError) as e:
        datapath._create_if_missing(cfg, cfg.path, fp, layout, logging.getLogger("t"))
    assert e.value.errno in (errno.ENOSPC, errno.EFBIG), e.value
    if e.value.errno == errno.ENOSPC:
        assert "not enough space" in str(e.value) and "preallocate" in str(e.value)
    assert not (tmp_path / "kv.img").exists()
