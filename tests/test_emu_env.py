"""The emulated controller's environment: a value it does not take is named before anything opens.

The controller reads TUTTI_EMU_DMA, TUTTI_EMU_COPY and TUTTI_EMU_FILE_MAP when it opens and refuses any
other value with EINVAL (so a typo never measures the wrong path); through Python that used to surface as
"tt_emu_open: Invalid argument".  Now attaching the gio path names the variable and its values, and
`tutti-admin doctor` reports it.
"""
import pytest

from tutti import Store
from tutti._devpath import EMU_ENV, emu_env_problem
from tutti.doctor import DEGRADED, OK
from tutti.doctor import gpu as doctor_gpu


def test_each_variable_takes_its_values_and_nothing_else():
    assert emu_env_problem({}) is None
    for name, values in EMU_ENV.items():
        for v in values:
            assert emu_env_problem({name: v}) is None, (name, v)
        why = emu_env_problem({name: values[0] + "s"})
        assert why and name in why and all(v in why for v in values), why
    assert "TUTTI_EMU_DMA=''" in emu_env_problem({"TUTTI_EMU_DMA": ""})


def test_attaching_gio_names_the_bad_variable(tmp_path, tiny_fp, monkeypatch):
    path = str(tmp_path / "s.img")
    Store.format([path], tiny_fp, n_slots=4)
    monkeypatch.setenv("TUTTI_EMU_DMA", "kernels")
    with Store.open([path]) as s:
        with pytest.raises(ValueError, match="TUTTI_EMU_DMA='kernels': one of kernel, copy"):
            s.attach("gio")
        s.attach("host")   # the store is unharmed and other paths attach


class _M:
    def __init__(self, environ):
        self.environ = environ


def test_doctor_reports_it():
    assert doctor_gpu.check_emu_env(_M({})).status == OK
    assert "gio kernels" in doctor_gpu.check_emu_env(_M({})).detail
    assert "copy engines" in doctor_gpu.check_emu_env(_M({"TUTTI_EMU_DMA": "copy"})).detail
    c = doctor_gpu.check_emu_env(_M({"TUTTI_EMU_COPY": "batched"}))
    assert c.status == DEGRADED and "TUTTI_EMU_COPY" in c.detail and "refuses to open" in c.detail
