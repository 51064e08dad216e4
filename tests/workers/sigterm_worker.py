"""A rank that torchrun stops while it waits in C++: steps flushed, then a store wait (the GIL
released, no Python run) until SIGTERM. ``argv``: the endpoint, then what the process does first
(``none``: nothing; ``handler``: installs a SIGTERM handler of its own before ``init``; ``chained``:
installs one after ``init`` that calls ours, as Lightning does; ``asyncio``: an asyncio loop with a
signal handler of its own opened and closed after ``init``, which leaves no wakeup fd, and waits in
Python). It says ``blocked`` once the main thread is where it waits."""

import asyncio
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

import rankscope as rs

endpoint, first = sys.argv[1], sys.argv[2]
said: list[int] = []
if first == "handler":
    signal.signal(signal.SIGTERM, lambda signum, frame: said.append(signum))
rs.init(experiment="sigterm", role="trainer", endpoint=endpoint)
if first == "chained":
    ours = signal.getsignal(signal.SIGTERM)

    def lightning_like(signum, frame):  # type: ignore[no-untyped-def]
        said.append(signum)
        ours(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGTERM, lightning_like)
if first == "asyncio":
    loop = asyncio.new_event_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: None)  # takes the wakeup fd
    loop.close()  # and leaves it unset
for step in range(5):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.flush(step)
waiting = threading.Event()


def say_blocked() -> None:
    waiting.wait(30)
    time.sleep(0.3)  # the main thread is in the wait by now
    print("blocked", os.getpid(), flush=True)


threading.Thread(target=say_blocked, daemon=True).start()
if first == "none":
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=40))
    waiting.set()
    store.wait(["never"])  # C++ until SIGTERM ends the process (or the store's timeout)
elif first == "asyncio":
    waiting.set()
    while True:  # Python runs the handler between two sleeps
        time.sleep(0.05)
else:
    waiting.set()
    deadline = time.monotonic() + 30
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)  # the chained flush runs meanwhile
    print("handled", said, flush=True)
