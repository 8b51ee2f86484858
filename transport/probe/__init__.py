"""transport-probe's machinery: histograms, loops, the C floor, servers, reports and plots.

The CLI is ``transport.tools.probe_cli``; the method is described in docs/probe.md.
"""

from transport.probe.histogram import LogHistogram
from transport.probe.loops import closed_loop, open_loop

__all__ = ["LogHistogram", "closed_loop", "open_loop"]
