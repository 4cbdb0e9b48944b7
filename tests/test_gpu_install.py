"""``TUTTI_GPU=1 pip install .`` builds libtutti_gpu.so and installs it where tutti.gpu finds it.

Users of the vLLM connector on a GPU install the package; the GPU data paths then need no
checkout and no TUTTI_GPU_LIB.  Needs nvcc (CI has it; no GPU is needed to build or load).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build_requirements():
    """pip builds without isolation (no index needed): this venv must hold pyproject's build-system."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        if int(version("setuptools").split(".")[0]) < 77:
            pytest.skip(f"setuptools {version('setuptools')} < 77 in this venv (pyproject's build-system)")
        version("cffi")
    except PackageNotFoundError as e:
        pytest.skip(f"build requirement missing in this venv: {e}")


@pytest.mark.skipif(shutil.which(os.environ.get("NVCC", "nvcc")) is None, reason="needs nvcc")
def test_gpu_install_puts_the_library_in_the_package(tmp_path):
    _build_requirements()
    target = tmp_path / "site"
    env = dict(os.environ, TUTTI_GPU="1")
    env.pop("TUTTI_GPU_LIB", None)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(ROOT)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    so = target / "tutti" / "gpu" / "libtutti_gpu.so"
    assert so.is_file()
    code = ("from tutti.gpu import library_path, lib; p = library_path(); L = lib(); "
            "print(p); print(bool(L.tt_store_format))")
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("TUTTI_GPU_LIB", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, loaded = r.stdout.split()
    assert Path(where).resolve() == so.resolve() and loaded == "True"


def test_gpu_install_flag_is_checked(tmp_path):
    _build_requirements()
    env = dict(os.environ, TUTTI_GPU="maybe")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(tmp_path / "site"), str(ROOT)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode != 0
    assert "TUTTI_GPU='maybe': expected 1 or 0" in r.stdout + r.stderr
