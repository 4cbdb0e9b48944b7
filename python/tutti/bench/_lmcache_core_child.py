"""lmcache's own RawBlockCore over the parent's buffers: run by ``--lmcache-python``, not imported by tutti.

``tutti-admin bench --compare lmcache --lmcache-python PY`` runs ``PY this-file SPEC`` (SPEC: JSON from
tutti.bench.lmcache_engines.LMCacheCoreEngine) with the memfds of the source and destination areas inherited.
It imports only the standard library, torch and lmcache, stores the chunks with ``RawBlockCore.put_many`` and
reads them back with ``load_many_into`` (LMCache's legacy raw-block storage plugin path), and prints one line:
``TUTTI-RESULT {json}`` (wall and CPU seconds of each step) or ``TUTTI-ERROR message`` (exit 3: lmcache does
not import).  The parent checks the bytes.  SPEC ``{"check": true}`` only imports and reports the versions.
"""
import importlib
import importlib.metadata
import json
import mmap
import os
import resource
import sys
import time


def _cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _timed(fn):
    c0, t0 = _cpu(), time.perf_counter()
    out = fn()
    return out, {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0}


def _drop_page_cache():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def main(argv):
    spec = json.loads(argv[1])
    try:
        torch = importlib.import_module("torch")
        rb = importlib.import_module("lmcache.v1.storage_backend.raw_block")
        mem = importlib.import_module("lmcache.v1.memory_management")
    except Exception as e:  # noqa: BLE001 - ImportError, or lmcache failing to initialise without CUDA
        print("TUTTI-ERROR cannot import lmcache: " + f"{type(e).__name__}: {e}".splitlines()[0], flush=True)
        return 3
    if spec.get("check"):  # the parent's preflight: lmcache imports here
        print("TUTTI-RESULT " + json.dumps({"lmcache_version": importlib.metadata.version("lmcache"),
                                           "torch_version": torch.__version__}), flush=True)
        return 0

    n, cb, size = spec["chunks"], spec["chunk_bytes"], spec["area_bytes"]
    src = mmap.mmap(spec["src_fd"], size, flags=mmap.MAP_SHARED)
    dst = mmap.mmap(spec["dst_fd"], size, flags=mmap.MAP_SHARED)
    dtype = getattr(torch, spec["dtype"])
    spans, layers, tokens = spec["spans"], spec["layers"], spec["chunk_tokens"]
    hidden = spec["token_bytes"] // dtype.itemsize

    def objs(area):
        flat = torch.frombuffer(area, dtype=torch.uint8)
        out = []
        for c in range(n):
            meta = mem.MemoryObjMetadata(shape=torch.Size([spans, layers, tokens, hidden]), dtype=dtype,
                                         address=c * cb, phy_size=cb, ref_count=1, fmt=mem.MemoryFormat.KV_2LTD)
            out.append(mem.TensorMemoryObj(flat[c * cb:(c + 1) * cb], meta, None))
        return flat, out

    src_t, src_objs = objs(src)
    dst_t, dst_objs = objs(dst)
    core = rb.RawBlockCore(rb.RawBlockCoreConfig(
        device_path=spec["device_path"], capacity_bytes=spec["file_bytes"], block_align=spec["align"],
        header_bytes=spec["header_bytes"], slot_bytes=spec["slot_bytes"], use_odirect=True, enable_zero_copy=True,
        meta_total_bytes=spec["meta_bytes"], meta_magic=b"LMCIDX01", meta_version=1,
        meta_checkpoint_interval_sec=60, meta_idle_quiet_ms=100, meta_enable_periodic=True,
        meta_verify_on_load=True, load_checkpoint_on_init=False, io_engine="io_uring",
        iouring_queue_depth=spec["queue_depth"]), key_namespace="legacy")
    try:
        ptrs, sizes = [], []
        for t in (src_t, dst_t):
            for off in range(0, size, 1 << 30):
                ptrs.append(t.data_ptr() + off)
                sizes.append(min(1 << 30, size - off))
        fixed = True
        try:
            core.raw_device().register_fixed_buffers(ptrs, sizes)  # as LMCache registers its allocator's pages
        except Exception:  # noqa: BLE001 - optional, as in LMCache: it logs and goes on without
            fixed = False
        keys = [rb.RawBlockKeySpec(encoded=f"tutti-bench@{spec['run']}@{c}",
                                   slot_identity=(spec["run"] << 32) | c) for c in range(n)]
        put, store = _timed(lambda: core.put_many(keys, src_objs))
        if not all(put.results):
            print(f"TUTTI-ERROR put_many stored {sum(put.results)} of {n} chunks", flush=True)
            return 1

        def sync():
            fd = os.open(spec["device_path"], os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)

        _, durable = _timed(sync)
        pattern = bytes([spec["poison"] & 0xFF]) * cb
        for c in range(n):
            dst[c * cb:(c + 1) * cb] = pattern
        dropped = _drop_page_cache() if spec.get("drop_cache", True) else False
        got, retrieve = _timed(lambda: core.load_many_into([k.encoded for k in keys], dst_objs))
        if not all(got):
            print(f"TUTTI-ERROR load_many_into loaded {sum(got)} of {n} chunks", flush=True)
            return 1
    finally:
        core.close()
    print("TUTTI-RESULT " + json.dumps({
        "store": store, "durable": durable, "retrieve": retrieve, "dropped": dropped, "fixed_buffers": fixed,
        "lmcache_version": importlib.metadata.version("lmcache"), "torch_version": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
