"""Shared fixtures: model fingerprints, store factories and loop block devices."""
import hashlib
import os
import random
import shutil
import subprocess

import pytest

from tutti import LLAMA3_8B, Fingerprint, Store


@pytest.fixture
def gpu_lib():
    """libtutti_gpu.so loaded (tutti.gpu's ABI binding; make gpu-lib, TUTTI_GPU_LIB), or the test skips."""
    from tutti.gpu import GpuLibraryMissing, lib

    try:
        return lib()
    except GpuLibraryMissing as e:
        pytest.skip(str(e))
    except OSError as e:  # present but not loadable here (no CUDA runtime)
        pytest.skip(f"libtutti_gpu.so not loadable: {e}")


# A tiny model for tests that need many blocks or many stores: 4 KiB objects,
# 32 KiB blocks.
TINY = Fingerprint(model_id="tests/tiny", dtype="float16", n_layers=4, kv_heads=2, head_dim=64,
                   block_size=16)


@pytest.fixture
def llama_fp():
    return LLAMA3_8B


@pytest.fixture
def tiny_fp():
    return TINY


@pytest.fixture
def rng(request):
    """A random generator seeded by the test's name, so failures reproduce."""
    return random.Random(request.node.nodeid)


@pytest.fixture
def make_store(tmp_path):
    """Format a store of ``n_members`` files in tmp_path and return their paths."""

    def make(fingerprint=TINY, n_slots=16, n_members=1, **kw):
        paths = [str(tmp_path / f"member{i}.img") for i in range(n_members)]
        Store.format(paths, fingerprint, n_slots=n_slots, **kw)
        return paths

    return make


def _file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def file_digest():
    """``file_digest(path)``: SHA-256 of a file or device, to prove nothing was written."""
    return _file_digest


def _flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


@pytest.fixture
def flip_byte():
    """``flip_byte(path, offset)``: invert one byte durably (the store reads with O_DIRECT)."""
    return _flip_byte


def _need_root_tools(*tools):
    if os.geteuid() != 0:
        pytest.skip("needs root to set up loop block devices")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (util-linux / e2fsprogs)")


@pytest.fixture
def loop_device(tmp_path):
    """Factory: a loop block device over a sparse file of ``size`` bytes (root only)."""
    _need_root_tools("losetup")
    devices = []

    def make(size, name="loop.img"):
        backing = tmp_path / name
        with open(backing, "wb") as f:
            f.truncate(size)
        r = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"losetup cannot attach a loop device here: {r.stderr.strip()}")
        devices.append(r.stdout.strip())
        return devices[-1]

    yield make
    for dev in devices:
        subprocess.run(["losetup", "--detach", dev], check=False)


@pytest.fixture
def mounted_device(tmp_path, loop_device):
    """A loop device holding an ext4 filesystem mounted read-only (nothing writes to it)."""
    _need_root_tools("mkfs.ext4", "mount", "umount")
    dev = loop_device(32 << 20, "ext4.img")
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        dev], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {r.stderr.strip()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-o", "ro", dev, str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()}")
    try:
        yield dev
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
