"""Store benchmark: layer-wise store and retrieve of a prefix against fio and a naive reader.

The workload is the one the store exists for: a prompt prefix of P tokens
(P / block_size KV blocks) held in host memory laid out like vLLM's paged KV
cache, with the prefix's blocks at shuffled memory block ids.  Each run

1. formats a store on the given path(s), sized for the prefix;
2. (fio) writes the store's data region sequentially with fio, O_DIRECT,
   io_uring, fsync at the end, with the fastest of FIO_CONFIGS (block size,
   queue depth) found once in an uncounted calibration pass: the write ceiling;
3. stores every block layer by layer: one write transaction, one
   ``txn.layer`` call per layer, ``finish`` (which makes the data and the
   commit records durable);
4. (fio) reads the data region sequentially, with the calibrated fastest of
   FIO_CONFIGS: the read ceiling;
5. retrieves every block layer by layer, submitting layer l+1 before waiting
   for layer l, and checks the bytes against what was stored;
6. reads every object again with one ``os.preadv`` per object, O_DIRECT, from
   Python (a per-object reader, as LMCache-style connectors do), at the
   (member, offset) the library's ``Store.locate`` gives, and checks the bytes
   too.

The page cache is dropped before every read pass when the process may.  All
figures are medians over the runs, and each ratio is the median of the
per-run ratios; GB/s is 10^9 bytes per second.  A sweep then retrieves the
first N blocks for growing N to show how CPU time and system calls per layer
scale with the number of blocks.

Modules: ``common`` (units, errors, helpers), ``fio`` (the fio baseline),
``machine`` (what it ran on), ``passes`` (the timed passes), ``run``
(BenchConfig, run_bench), ``report`` (rows and the markdown section).
"""
from .common import (
    GB,
    BenchError,
    drop_page_cache,
    has_store_magic,
    host_memory_available,
    human_bytes,
    is_block_device,
    member_bytes,
    room_for,
    scratch_dir,
)
from .fio import FIO_CONFIGS, fio_available, fio_command, parse_fio_json, pick_fio_config, run_fio
from .machine import cpu_model, describe_path, machine_info, vllm_cpu_machine
from .report import (
    SECTION_TITLE,
    markdown_section,
    ratio_rows,
    replace_section,
    result_rows,
    shown_command,
    sweep_rows,
    write_markdown,
)
from .run import TARGETS, BenchConfig, run_bench

__all__ = [
    "GB", "BenchError", "drop_page_cache", "has_store_magic", "host_memory_available", "human_bytes",
    "is_block_device", "member_bytes", "room_for", "scratch_dir",
    "FIO_CONFIGS", "fio_available", "fio_command", "parse_fio_json", "pick_fio_config", "run_fio",
    "cpu_model", "describe_path", "machine_info", "vllm_cpu_machine", "replace_section",
    "SECTION_TITLE", "markdown_section", "ratio_rows", "result_rows", "shown_command", "sweep_rows", "write_markdown",
    "TARGETS", "BenchConfig", "run_bench",
]
