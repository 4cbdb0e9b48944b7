#!/usr/bin/env python3
"""Send one request of the HIL guest to QEMU's QMP socket (run-qemu.sh forwards the guest's
"HIL-QMP <json>" lines here).

    qmp.py SOCKET '<json>'
        a QMP command, e.g. {"execute": "block_set_io_throttle", "arguments": {...}}
    qmp.py SOCKET '{"hil": "pause", "ms": N, "after_ms": M}'
        wait M ms, QMP "stop", wait N ms, "cont": the VM paused with the guest's command in flight

Prints the command and each reply on one line; exit 1 on an error reply or no connection.
"""
import json
import socket
import sys
import time


def call(f, sock, cmd):
    """Send @cmd, return its reply (events are skipped)."""
    sock.sendall((json.dumps(cmd) + "\n").encode())
    while True:
        line = f.readline()
        if not line:
            raise ConnectionError("QMP socket closed")
        reply = json.loads(line)
        if "event" not in reply:
            print(f"qmp: {json.dumps(cmd)} -> {json.dumps(reply)}", flush=True)
            return reply


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    req = json.loads(sys.argv[2])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    f = sock.makefile("r")
    f.readline()  # greeting
    call(f, sock, {"execute": "qmp_capabilities"})
    if req.get("hil") == "pause":
        time.sleep(req.get("after_ms", 0) / 1000)
        replies = [call(f, sock, {"execute": "stop"})]
        time.sleep(req["ms"] / 1000)
        replies.append(call(f, sock, {"execute": "cont"}))
    else:
        replies = [call(f, sock, req)]
    sys.exit(1 if any("error" in r for r in replies) else 0)


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        print(f"qmp: {e}", flush=True)
        sys.exit(1)
