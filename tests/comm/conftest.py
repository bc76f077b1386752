"""Virtual ranks run one spinning kernel per stream on one GPU, and streams that share a
hardware work queue run one after the other: a rank would then wait for a peer queued behind
it. More queues than ranks (+ torch's stream) avoids that; the driver reads this when it
creates the context, which no test has done yet at collection time."""

from __future__ import annotations

import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
