"""The public headers' usage text cannot drift from the code: examples exist (`make ctest` compiles
them: scripts/header_examples.py writes them out), named functions exist, engine.h's list of engines
is the library's.

(staged_path.h's example once closed the path with tt_staged_close(), which never existed; engine.h's list
left out kqueue.)
"""
import importlib.util
import re
from pathlib import Path

import pytest

from tutti import Store, TuttiError

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "libtutti" / "include"
HEADERS = sorted((INCLUDE / "tutti").glob("*.h"))


def _load_examples_script():
    spec = importlib.util.spec_from_file_location("header_examples", ROOT / "scripts" / "header_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


examples = _load_examples_script().examples


def test_the_data_path_headers_have_examples():
    have = {h.name for h in HEADERS if examples(h)}
    assert {"devpath.h", "staged_path.h", "gds_path.h", "gio_path.h"} <= have


def test_the_makefile_compiles_the_examples():
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/header_examples.py" in makefile
    assert "ctest: $(addprefix $(BUILD)/tests/,$(CTESTS)) $(HEADER_EXAMPLES)" in makefile


def _declared_functions() -> set:
    """Every function (inline too), function-like macro and variable declared in libtutti's headers,
    public and internal (a comment may point at the implementation)."""
    names = set()
    for h in list(INCLUDE.rglob("*.h")) + list((ROOT / "libtutti" / "src").rglob("*.h")) + \
            list((ROOT / "libtutti" / "src").rglob("*.cuh")):
        text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
        names |= set(re.findall(r"\b(tt_\w+)\s*\(", text))
        names |= set(re.findall(r"\b(tt_\w+)\s*;", text))
    return names


def test_functions_the_headers_name_exist():
    declared = _declared_functions()
    missing = []
    for h in HEADERS:
        for comment in re.findall(r"/\*.*?\*/", h.read_text(), re.S):
            missing += [f"{h.name}: {n}()" for n in re.findall(r"\b(tt_\w+)\(", comment) if n not in declared]
    assert not missing, missing


def test_engine_h_lists_the_librarys_engines(make_store):
    text = (INCLUDE / "tutti" / "engine.h").read_text()
    block = text[text.index(" * I/O engines"):text.index("#ifndef TUTTI_ENGINE_H")]
    listed = re.findall(r"^ \*   (\w+)\s{2,}", block, re.M)
    assert listed, "engine.h lists no engines"
    paths = make_store(n_slots=4)
    with pytest.raises(TuttiError) as e:
        Store.open(paths, engine="no-such-engine")
    known = re.search(r"unknown engine 'no-such-engine' \(([^)]*)\)", str(e.value)).group(1).split(", ")
    assert known == listed + ["auto"]
    for name in listed:  # and each is one the library takes by name (kqueue needs tutti.ko nodes)
        try:
            Store.open(paths, engine=name).close()
        except TuttiError as err:
            assert name == "kqueue" and "unknown engine" not in str(err), err
