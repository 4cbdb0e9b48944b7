"""Guest-only tests: they run inside the QEMU HIL guest (tests/hil/run-guest.sh).

On the host everything here is skipped: it needs tutti.ko bound to emulated
NVMe controllers.
"""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TUTTI_HIL") == "1":
        return
    skip = pytest.mark.skip(reason="needs the QEMU HIL guest (TUTTI_HIL=1; see tests/hil/run-guest.sh)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)
