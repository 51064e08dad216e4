"""A rank that torchrun stops while it waits in C++: steps flushed, the last ones not sent yet, then
a store wait (the GIL released, no Python run) until SIGTERM. ``argv``: the endpoint, then what
the process does first (``none``: nothing; ``handler``: installs a SIGTERM handler of its own
before ``init``; ``chained``: installs one after ``init`` that calls ours, as Lightning does;
``wakeup``: holds the signal wakeup fd before ``init``, as asyncio's loop does, and waits in Python)."""

import os
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

import rankscope as rs

endpoint, first = sys.argv[1], sys.argv[2]
said: list[int] = []
if first == "wakeup":
    held_r, held_w = os.pipe()
    os.set_blocking(held_w, False)
    signal.set_wakeup_fd(held_w)
if first == "handler":
    signal.signal(signal.SIGTERM, lambda signum, frame: said.append(signum))
rs.init(experiment="sigterm", role="trainer", endpoint=endpoint)
if first == "chained":
    ours = signal.getsignal(signal.SIGTERM)

    def lightning_like(signum, frame):  # type: ignore[no-untyped-def]
        said.append(signum)
        ours(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGTERM, lightning_like)
rs.record_metric("loss", 1.0)
rs.flush(0)
time.sleep(0.3)  # the first round sends step 0; the next waits 0.4 s
for step in range(1, 5):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.flush(step)
print("blocked", os.getpid(), flush=True)
if first == "none":
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))
    store.wait(["never"])  # C++ until SIGTERM ends the process (or the test's kill)
elif first == "wakeup":
    while True:  # Python runs the handler between two sleeps
        time.sleep(0.05)
else:
    deadline = time.monotonic() + 30
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)  # the chained flush's thread runs meanwhile
    print("handled", said, flush=True)
