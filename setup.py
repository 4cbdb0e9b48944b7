"""Build glue that pyproject.toml cannot express: the cffi extension and the version.

The version comes from libtutti's header so the C library and the Python
package can never disagree.
"""
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _version():
    header = (HERE / "libtutti/include/tutti/tutti.h").read_text()
    return re.search(r'#define TUTTI_VERSION_STRING "([^"]+)"', header).group(1)


setup(
    version=_version(),
    cffi_modules=["python/tutti/_build_ffi.py:ffibuilder"],
)
