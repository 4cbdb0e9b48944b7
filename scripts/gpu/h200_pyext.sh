#!/usr/bin/env bash
# Build the tutti package's C extension (tutti._tutti) in place on the H200,
# where pip cannot reach an index: cffi/pycparser come from .h200/whl and
# liburing/xxhash from .h200/root (scripts/gpu/h200_deps.sh). Source this
# file: it exports PYTHONPATH and LD_LIBRARY_PATH for what runs after it.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
R=$PWD/.h200/root
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .h200/whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ls python/tutti/_tutti*.so >/dev/null 2>&1 ||
	(cd python && CFLAGS="-I$R/usr/include" LDFLAGS="-L$R/usr/lib/x86_64-linux-gnu" \
		python3 -c 'from tutti._build_ffi import ffibuilder; ffibuilder.compile(tmpdir=".", verbose=False)' \
		>/tmp/pyext.log 2>&1) || { tail -20 /tmp/pyext.log; return 1; }
python3 -c 'import tutti._tutti' || return 1
