"""A bare echo server for the raw floors (transport/probe/raw.py): no protocol, no env.

    python -m transport.probe.raw_server KIND ADDRESS REQUEST_BYTES RESPONSE_BYTES

KIND ``unix``: a Unix stream socket at ADDRESS, each request of REQUEST_BYTES answered with
RESPONSE_BYTES. ``zmq``: a ZeroMQ ROUTER bound to ADDRESS (``ipc://...`` or ``tcp://...``),
each message answered with one of RESPONSE_BYTES. Prints ``ready ADDRESS`` once it listens,
serves one client until it disconnects or SIGTERM, and removes its socket file.
"""

from __future__ import annotations

import os
import signal
import socket
import sys


def serve_unix(path: str, request_bytes: int, response_bytes: int) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1)
        print(f"ready {path}", flush=True)
        conn, _ = listener.accept()
        request = memoryview(bytearray(request_bytes))
        response = bytes(response_bytes)
        with conn:
            while True:
                got = 0
                while got < request_bytes:
                    n = conn.recv_into(request[got:])
                    if n == 0:
                        return
                    got += n
                conn.sendall(response)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop now must not skip the unlink
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


def serve_zmq(address: str, response_bytes: int) -> None:
    import zmq

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    # a SIGTERM that lands on one of libzmq's threads does not interrupt a blocking recv: wake
    # up now and then so that Python runs the handler (the socket file is removed below)
    router.setsockopt(zmq.RCVTIMEO, 200)
    try:
        router.bind(address)
        print(f"ready {address}", flush=True)
        response = bytes(response_bytes)
        while True:
            try:
                identity, _request = router.recv_multipart(copy=False)
            except zmq.Again:
                continue
            router.send_multipart([identity, response], copy=False)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        router.close()
        context.term()
        if address.startswith("ipc://"):
            try:
                os.unlink(address[len("ipc://") :])
            except OSError:
                pass


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("unix", "zmq"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, address, request_bytes, response_bytes = argv[0], argv[1], int(argv[2]), int(argv[3])

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    if kind == "unix":
        serve_unix(address, request_bytes, response_bytes)
    else:
        serve_zmq(address, response_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
