"""A process that serves Prometheus metrics with prometheus_client, as vLLM and SGLang do.

argv: port. Counts 7 tokens 30 times, sets a gauge to 3 and observes 40 latencies, then serves
(the values a scrape sees never change after "ready") until killed.
"""

from __future__ import annotations

import sys
import time

from prometheus_client import Counter, Gauge, Histogram, start_http_server

tokens = Counter("generated_tokens", "Tokens generated")
running = Gauge("num_requests_running", "Requests in flight")
latency = Histogram("e2e_latency_seconds", "End-to-end latency", buckets=(0.1, 0.2, 0.5, 1.0))
for _ in range(30):
    tokens.inc(7)
running.set(3)
for i in range(40):
    latency.observe(0.05 + 0.02 * i)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
print("ready", flush=True)
while True:
    time.sleep(1)
