"""The test programs' one TAP dialect (libtutti/tests/tap.h, tests/hil/hil.h) and its one consumer
(scripts/tap-run: Perl's prove), as `make ctest`, `make gpu-test` and the HIL guest runner use them.

Before, `make ctest` judged exit codes only, so a test that died between two checks with exit 0
(or whose plan was never printed) passed, the GPU tests' "skip" was exit 77 (a failure there), and
the guest programs printed unnumbered checks and no plan.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAP_RUN = ROOT / "scripts" / "tap-run"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("prove") is None,
                                reason="needs gcc and prove (Debian package perl: scripts/bootstrap.sh deps)")

PROGRAM = r"""
#include <signal.h>
#include <sys/wait.h>
#include HEADER

int main(int argc, char **argv)
{
	char mode = argc > 1 ? argv[1][0] : 'p';

	if (mode == 'S')
		tap_skip_all("no device here");
	tap_ok(1, "first");
	if (mode == 'c')
		raise(SIGSEGV);			/* a crash before the plan */
	if (mode == 'q')
		_exit(0);			/* exit 0, no plan */
	if (mode == 'k') {
		tap_skip("one part not here");
	}
	if (mode == 'f' && fork() == 0)
		exit(0);			/* a child's exit prints no plan */
	if (mode == 'f')
		wait(NULL);
	if (mode == 'n')
		tap_ok(0, "second");
	PLAN_END
}
"""


def build(tmp_path, header: str, plan_end: str) -> Path:
    src = tmp_path / "prog.c"
    src.write_text(PROGRAM.replace("HEADER", header).replace("PLAN_END", plan_end))
    exe = tmp_path / "prog"
    subprocess.run(["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
                    "-I", str(ROOT / "libtutti" / "include"), "-I", str(ROOT / "libtutti" / "tests"),
                    "-I", str(ROOT / "tests" / "hil"), str(src), "-o", str(exe)], check=True)
    return exe


def judge(tmp_path, exe: Path, mode: str) -> subprocess.CompletedProcess:
    """scripts/tap-run on one program run in ``mode`` (a wrapper: prove runs files)."""
    wrapper = tmp_path / f"t_{mode}"
    wrapper.write_text(f"#!/bin/sh\nexec {exe} {mode}\n")
    wrapper.chmod(0o755)
    return subprocess.run([str(TAP_RUN), str(wrapper)], capture_output=True, text=True)


@pytest.mark.parametrize("header,plan_end", [('"tap.h"', "return tap_done();"),
                                              ('"hil.h"', "return tap_failed;")],
                         ids=["tap.h", "hil.h (plan at exit)"])
def test_the_consumer_judges_plans_skips_and_failures(tmp_path, header, plan_end):
    exe = build(tmp_path, header, plan_end)
    r = judge(tmp_path, exe, "p")
    assert r.returncode == 0 and "Result: PASS" in r.stdout, r.stdout
    r = judge(tmp_path, exe, "c")
    assert r.returncode != 0 and "No plan found" in r.stdout, r.stdout
    r = judge(tmp_path, exe, "q")
    assert r.returncode != 0 and "No plan found" in r.stdout, r.stdout
    r = judge(tmp_path, exe, "n")
    assert r.returncode != 0 and "Failed: 1" in r.stdout, r.stdout
    r = judge(tmp_path, exe, "S")
    assert r.returncode == 0 and "skipped: no device here" in r.stdout, r.stdout
    r = judge(tmp_path, exe, "f")
    assert r.returncode == 0 and "Result: PASS" in r.stdout, r.stdout
    out = subprocess.run([str(exe), "f"], capture_output=True, text=True).stdout
    assert out.count("1..") == 1, out
    out = subprocess.run([str(exe), "k"], capture_output=True, text=True).stdout
    assert "ok 2 - # SKIP one part not here" in out, out


def test_a_saved_output_with_a_short_plan_fails(tmp_path):
    f = tmp_path / "out.tap"
    f.write_text("ok 1 - a\n1..3\n")
    r = subprocess.run([str(TAP_RUN), "--saved", str(f)], capture_output=True, text=True)
    assert r.returncode != 0 and "Bad plan" in r.stdout, r.stdout


def test_every_test_program_is_run_by_something():
    """Each libtutti/tests program with a main() is run by make ctest (test_*.c), scripts/gpu/h200_run.sh
    (test_gpu_*.cu, hd_compile.cu) or, for the fault-model driver's parts, linked into one."""
    makefile = (ROOT / "Makefile").read_text()
    gpu_run = (ROOT / "scripts" / "gpu" / "h200_run.sh").read_text()
    assert "CTESTS := $(basename $(notdir $(wildcard libtutti/tests/test_*.c)))" in makefile
    assert "libtutti/tests/test_gpu_*.cu libtutti/tests/hd_compile.cu" in gpu_run
    for f in sorted((ROOT / "libtutti" / "tests").iterdir()):
        if f.suffix not in (".c", ".cu") or "int main(" not in f.read_text():
            continue
        assert (f.suffix == ".c" and f.name.startswith("test_")) or \
            (f.suffix == ".cu" and (f.name.startswith("test_gpu_") or f.name == "hd_compile.cu")), f.name
