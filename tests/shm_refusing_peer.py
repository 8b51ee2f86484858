"""A stand-in shm:// server process that answers SHUTDOWN with an error status (issue 22 item 5).

No server of the project does that on purpose today (both swallow env ``close()`` errors), but
the protocol allows it (a slot status on any command), so a client's ``close()`` must survive
it. This peer owns a real POSIX shm region of the pac_env layout (1 env, with its schema area, so
clients can discover the schema), answers RESET and STEP with status 0 (zeroed results) and
SHUTDOWN with ``INTERNAL`` + a text. Run: ``python -m tests.shm_refusing_peer shm://NAME``; it
prints ``ready shm://NAME`` and serves until SIGTERM, then unlinks its segment.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from transport import native
from transport.backends.shm.region import (
    CONTROL_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    Region,
    RegionState,
    ShmLayout,
    SlotCommand,
    own_start_time,
    parse_url,
    schema_area,
    write_text,
)
from transport.generated import pac_env
from transport.protocol import ErrorCode

REFUSAL = "the test peer refuses SHUTDOWN"


def main(url: str) -> None:
    shm = parse_url(url)
    layout = ShmLayout.of(pac_env.SCHEMA)
    area = schema_area(pac_env.SCHEMA)
    size = layout.region_size(1) + len(area)
    fd = native.shm_create(shm.segment, size)
    try:
        region = Region(shm.segment, fd, size, layout, owner=True, slots=1)
    finally:
        os.close(fd)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        region.map[size - len(area) : size] = area
        obs_size, act_size = layout.obs_size, layout.act_size
        for field, value in (
            ("magic", MAGIC),
            ("version", LAYOUT_VERSION),
            ("num_envs", 1),
            ("obs_size", obs_size),
            ("act_size", act_size),
            ("slot_size", layout.slot_size),
            ("fingerprint", pac_env.SCHEMA.fingerprint),
            ("owner_pid", os.getpid()),
            ("owner_start_time", own_start_time()),
        ):
            region.set(field, value)
        native.store_release(region.state_word, RegionState.READY)
        fields = layout.slot_fields
        request = region.strided("sem_action_ready")
        command = region.strided("command")
        status = region.strided("status")
        error_len = region.strided("error_len")
        error_text = region.strided("error_text")
        response = native.word(region.map, CONTROL_SIZE + fields["sem_result_ready"].offset)
        print(f"ready {url}", flush=True)
        while not stop:
            seq = int(request[0]) & native.SEQ_MASK
            if seq == native.load_acquire(response) & native.SEQ_MASK:
                time.sleep(0.001)
                continue
            if int(command[0]) == SlotCommand.SHUTDOWN:
                status[0] = int(ErrorCode.INTERNAL)
                error_len[0] = write_text(error_text[0], REFUSAL)
            else:
                status[0] = 0
            native.publish(response, seq)
        native.store_release(region.state_word, RegionState.CLOSED)
        del request, command, status, error_len, error_text
    finally:
        native.shm_unlink(shm.segment)
        region.close()


if __name__ == "__main__":
    main(sys.argv[1])
