"""Ctrl-C while a unix:// request is being sent (issue "Never a crash"): part of the frame may be
in the socket, so the stream cannot be put back in step. Before: the channel went on, and the
next request's frame followed half a frame (the server read garbage, or the client waited for
a reply that never came). Now the connection is closed and every later call is a PeerGoneError
saying to open a new client (as over http). Real sockets: a socketpair whose peer never reads,
so the send blocks with part of a big body in the kernel's buffer."""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any

import pytest

from transport.backends.stream import FramedSocket, StreamChannel
from transport.errors import PeerGoneError


def test_ctrl_c_in_the_middle_of_a_send_closes_the_connection() -> None:
    mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    channel = StreamChannel(FramedSocket(mine, timeout=30.0), timeout=30.0)

    def on_sigint(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    main = threading.get_ident()  # the signal goes to the thread blocked in sendmsg
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):  # 8 MiB: far more than the socket buffers hold
            channel.request(0x10, bytes(8 << 20))
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)
    try:
        with pytest.raises(
            PeerGoneError, match=r"interrupted \(KeyboardInterrupt\) while its request"
        ):
            channel.request(0x10, bytes(8))
        assert mine.fileno() == -1  # closed: the server sees the connection end, not a new frame
    finally:
        channel.close()
        peer.close()
