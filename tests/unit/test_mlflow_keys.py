"""The MLflow view's pure parts: the key mapping (collision-free, every output one MLflow takes)
and the cutting of a step into ``log-batch`` requests within MLflow's limits."""

from __future__ import annotations

import json
import posixpath
import re
from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from rankscope.backends.mlflow.batches import (
    MAX_ENTITIES,
    MAX_METRICS,
    MAX_PARAMS_TAGS,
    REQUEST_BYTES,
    Entry,
    MetricPoint,
    param,
    tag,
    take,
)
from rankscope.backends.mlflow.keys import MAX_KEY, KeyMap, mlflow_key

MLFLOW_NAME = re.compile(r"^[/\w.\- :]*$")  # mlflow.utils.validation.validate_param_and_metric_name


def _mlflow_takes(key: str) -> bool:
    """What MLflow's server checks of a key (``_validate_metric_name`` and the length limit)."""
    norm = posixpath.normpath(key)
    unique = norm == key and norm != "." and not norm.startswith("..") and not norm.startswith("/")
    return bool(MLFLOW_NAME.match(key)) and unique and 0 < len(key) <= MAX_KEY


def test_keys_mlflow_takes_stay_and_the_others_are_mapped() -> None:
    for key in ("loss", "trace/train/forward_ms", "a b:c", "x" * 250):
        assert mlflow_key(key) == key
    for key in ("val//acc", "a/./b", "../up", "/lead", "trail/", "acc@1", "ünï", "y" * 251, "loss-0123456789", ""):
        mapped = mlflow_key(key)
        assert mapped != key and re.search(r"-[0-9a-f]{10}$", mapped) and _mlflow_takes(mapped), (key, mapped)
    assert mlflow_key("val//acc").startswith("val/_/acc-")


@given(st.lists(st.text(max_size=300), unique=True, max_size=50))
def test_every_key_maps_to_one_mlflow_takes_and_no_two_share_one(keys: list[str]) -> None:
    mapped = [mlflow_key(k) for k in keys]
    assert all(_mlflow_takes(m) for m in mapped)
    assert len(set(mapped)) == len(keys)


def test_the_key_map_records_what_it_mapped() -> None:
    keys = KeyMap()
    assert keys("loss") == "loss" and not keys.changed
    odd = keys("a//b")
    assert keys.changed and keys.taken() == {odd: "a//b"} and not keys.changed


def test_a_step_of_2500_keys_is_three_requests_and_params_go_alone() -> None:
    queue: deque[Entry] = deque(MetricPoint(f"k{i}", float(i), 1, 0) for i in range(2500))
    sizes = []
    while (batch := take(queue)) is not None:
        assert batch.points <= MAX_METRICS and batch.entries <= MAX_ENTITIES
        assert len(json.dumps(batch.body("r" * 32))) < REQUEST_BYTES + 1000
        sizes.append(batch.points)
        for _ in range(batch.entries):
            queue.popleft()
    assert sizes == [1000, 1000, 500]
    mixed: deque[Entry] = deque([param("p", "x" * 7000), *(tag(f"t{i}", "v" * 9000) for i in range(150))])
    first = take(mixed)
    assert first is not None and len(first.params) == 1 and not first.tags  # params alone
    assert len(first.params[0]["value"]) == 6000 and first.params[0]["value"].endswith("…")
    mixed.popleft()
    second = take(mixed)
    assert second is not None and len(second.tags) <= MAX_PARAMS_TAGS
    assert second.bytes <= REQUEST_BYTES  # 8,000-character tags: the request's bytes bound it first


def test_non_finite_values_are_sent_as_protobuf_json_reads_them() -> None:
    queue: deque[Entry] = deque(MetricPoint(k, v, 1, 0) for k, v in (("a", float("nan")), ("b", float("-inf"))))
    batch = take(queue)
    assert batch is not None and [m["value"] for m in batch.metrics] == ["NaN", "-Infinity"]
