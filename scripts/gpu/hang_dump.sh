#!/usr/bin/env bash
# hang_dump.sh SECS CMD...: run CMD; if it still runs after SECS, print every
# thread's native stack of each of its processes (gdb if present, else the
# kernel's view) and kill it. For hangs between host threads and GPU kernels.
secs=$1; shift
"$@" &
pid=$!
for _ in $(seq "$secs"); do kill -0 $pid 2>/dev/null || { wait $pid; exit $?; }; sleep 1; done
echo "== hang_dump: still running after $secs s"
for p in $pid $(pgrep -P $pid) $(pgrep -f multiprocessing.spawn); do
	echo "== pid $p: $(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -c1-120)"
	if command -v gdb >/dev/null; then
		timeout 30 gdb -p "$p" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^#|^Thread" | head -120
	else
		for t in /proc/$p/task/*; do echo "-- $(cat $t/comm) $(cat $t/wchan 2>/dev/null) $(awk '{print $3}' $t/stat)"; done | sort | uniq -c | head -40
	fi
done
pkill -KILL -f multiprocessing.spawn; kill -KILL $pid 2>/dev/null
exit 124
