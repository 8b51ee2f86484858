"""``python -m transport.backends.zmq keygen DIR``: make CURVE key pairs."""

from __future__ import annotations

import sys

from transport.backends.zmq.curve import main

sys.exit(main())
