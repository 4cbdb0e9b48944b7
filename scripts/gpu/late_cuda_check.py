# CUDA started before tutti: the gio path must refuse (EDEADLK), not hang.
import errno, os, sys, tempfile
import torch
torch.zeros(1, device="cuda")
from tutti.gpu import hw_queues, lib
print("context_exists", hw_queues.context_exists(), "env", os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
      "hw_queues", lib().tt_gpu_hw_queues())
from tutti.gpu import EmulatedController
try:
    EmulatedController(n_ns=1, ns_bytes=1 << 20, n_queues=2, depth=64, n_threads=1)
    print("LATE: NOT REFUSED"); sys.exit(1)
except OSError as e:
    print("LATE: refused", e.errno == errno.EDEADLK, e); sys.exit(0 if e.errno == errno.EDEADLK else 1)
