"""In the HIL guest: `tutti-admin doctor --json` with tutti.ko loaded and controllers A and B attached.

Prints one line (what doctor said, or what was wrong) and exits 1 when the report is not true of the
guest: tutti.ko loaded with its version, both controllers listed on tutti.ko, an exit code that matches
the verdict, a fix on every line that is not ok.  Usage: doctor_guest.py PCI_A PCI_B
"""
import json
import os
import subprocess
import sys

EXIT = {"ready": 0, "degraded": 1, "unusable": 3}


def main(a: str, b: str) -> int:
    admin = os.path.join(os.path.dirname(sys.executable), "tutti-admin")
    res = subprocess.run([admin, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        print(f"not JSON (exit {res.returncode}): {res.stdout[:200]!r} {res.stderr[:200]!r}")
        return 1
    d = {c["name"]: c for c in rep["checks"]}
    bad = []
    if res.returncode != EXIT[rep["verdict"]]:
        bad.append(f"exit {res.returncode} for verdict {rep['verdict']}")
    ko = d.get("tutti.ko", {})
    if ko.get("status") != "ok" or "version 0.1.0" not in ko.get("detail", ""):
        bad.append(f"tutti.ko line: {ko}")
    for bdf in (a, b):
        line = d.get(f"nvme {bdf}", {})
        if "driver tutti.ko" not in line.get("detail", "") or bdf not in ko.get("detail", ""):
            bad.append(f"controller {bdf}: {line}")
    bad += [f"{c['name']} has no fix" for c in rep["checks"] if c["status"] in ("degraded", "unusable")
            and not c["fix"]]
    if bad:
        print("; ".join(bad))
        return 1
    print(f"{rep['verdict']}: {ko['detail']}; " + "; ".join(d[f"nvme {x}"]["detail"] for x in (a, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
