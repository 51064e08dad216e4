"""Scoped tokens as pure parts: the token file, the header to scope, a scope's experiments (no two
scopes share one: the overlap and separator rules), and the control port as a scoped token sees
it (``sink.edge.auth``, ``sink.edge.control``, ``checked.Scope``), down to the overview of a sink
that listens on no port. Over real sockets: ``tests/integration/test_sink_scopes.py``."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest

from rankscope.cli.app import build_parser
from rankscope.cli.sink import sink_config
from rankscope.core import names as attr
from rankscope.otlp.common import key_value
from rankscope.otlp.raw import parse_metrics
from rankscope.sink import Sink, SinkConfig
from rankscope.sink.testing import (
    ALL,
    Client,
    Control,
    Keys,
    Notes,
    Scope,
    SpanQuery,
    authorized,
    load_tokens,
    scoped,
)

from ..victim import step_request

SECRET = "a-secret-of-24-characters"


def test_a_scope_writes_the_experiments_it_names_or_prefixes() -> None:
    scope = Scope("rl", ("grpo-*", "eval"))
    assert [scope.allows(e) for e in ("grpo-qwen", "grpo-", "eval", "eval-2", "grp", "x")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert ALL.allows("anything") and ALL.label == "the sink's all-experiments scope"


def test_a_header_becomes_its_tokens_scope_and_a_wrong_one_none() -> None:
    rl = Scope("rl", ("grpo-*",))
    keys = Keys("the-all-experiments-token", {SECRET: rl})
    assert keys.scope_of(f"Bearer {SECRET}") is rl and keys.scope_of(f"  bEaReR   {SECRET} ") is rl
    assert keys.scope_of("Bearer the-all-experiments-token") is ALL
    for wrong in (None, "", "Bearer", "Basic " + SECRET, f"Bearer {SECRET}x", SECRET):
        assert keys.scope_of(wrong) is None, wrong
    # not UTF-8: aiohttp hands the bytes over as surrogate escapes, grpcio as Latin-1; raw bytes too
    for raw in ("Bearer \udcff\udcfe", "Bearer \xff\xfe", "Bearer \ud800", b"Bearer \xff\xfe"):
        assert keys.scope_of(raw) is None and not authorized("token", raw)
    assert Keys().scope_of(None) is ALL and Keys().scope_of("Bearer \udcff") is ALL  # no tokens: one scope
    twice = [f"Bearer {SECRET}", f"Bearer {SECRET}"]
    assert keys.scope_of_headers(twice) is None and keys.scope_of_headers([]) is None  # exactly one, or none
    assert keys.scope_of_headers(twice[:1]) is keys.scope_of(twice[0]) and Keys().scope_of_headers(twice) is ALL
    with pytest.raises(ValueError, match="also the sink's --token"):
        Keys(SECRET, {SECRET: rl})


def test_the_token_file_is_toml_or_json_and_its_mistakes_are_named(tmp_path: Path) -> None:
    toml = tmp_path / "tokens.toml"
    toml.write_text(f'[scopes.rl]\ntokens = ["{SECRET}"]\nexperiments = ["grpo-*"]\n')
    assert load_tokens(toml) == {SECRET: Scope("rl", ("grpo-*",))}
    as_json = tmp_path / "tokens.json"
    as_json.write_text(json.dumps({"scopes": {"pre": {"token": SECRET, "experiments": ["*"]}}}))
    assert load_tokens(as_json) == {SECRET: Scope("pre", ("*",))}
    bad: list[tuple[Any, str]] = [
        ({}, "no scopes"),
        ({"scopes": {"rl": {"tokens": ["short"], "experiments": ["x"]}}}, "at least 16"),
        ({"scopes": {"rl": {"tokens": [SECRET + " x"], "experiments": ["x"]}}}, "no spaces"),
        ({"scopes": {"rl": {"tokens": [SECRET], "experiments": []}}}, "'experiments' must be"),
        ({"scopes": {"rl": {"tokens": [SECRET], "experiments": ["a*b"]}}}, "one '\\*' at its end"),
        ({"scopes": {"r l": {"tokens": [SECRET], "experiments": ["x"]}}}, "scope's name"),
        (
            {"scopes": {"a": {"tokens": [SECRET], "experiments": ["x"]}, "b": {"token": SECRET, "experiments": ["y"]}}},
            "also scope 'a'",
        ),
    ]
    for found, why in bad:
        as_json.write_text(json.dumps(found))
        with pytest.raises(ValueError, match=why):
            load_tokens(as_json)
    toml.write_text("[scopes")
    with pytest.raises(ValueError, match="not TOML"):
        load_tokens(toml)
    both = {"scopes": {"rl": {"token": SECRET, "tokens": [SECRET + "2"], "experiments": ["x"]}}}
    long = {"scopes": {"rl": {"tokens": ["t" * 4097], "experiments": ["x"]}}}
    for found, why in ((both, "not both"), (long, "at most 4096")):
        as_json.write_text(json.dumps(found))
        with pytest.raises(ValueError, match=why):
            load_tokens(as_json)
    scope = json.dumps({"tokens": [SECRET], "experiments": ["x"]})
    as_json.write_text(f'{{"scopes": {{"rl": {scope}, "rl": {scope}}}}}')  # named twice: the last does not win
    with pytest.raises(ValueError, match="named twice"):
        load_tokens(as_json)
    as_json.write_text("[" * 100_000 + "]" * 100_000)  # a parser's recursion, not a traceback
    with pytest.raises(ValueError, match=r"nested too deeply|not JSON"):
        load_tokens(as_json)


def _file(*scopes: tuple[str, list[str]]) -> dict[str, Any]:
    """A tokens file's content: each scope its own token and these experiments."""
    return {"scopes": {name: {"token": f"{SECRET}-{name}", "experiments": e} for name, e in scopes}}


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("one scope may take every experiment", _file(("all", ["*"]))),
    ("a separator keeps neighbours apart", _file(("a", ["team-a-*"]), ("ab", ["team-ab-*"]))),
    ("an exact id is not under the prefix of its own name", _file(("a", ["team-a-*"]), ("bare", ["team-a"]))),
    (
        "each separator is its own prefix",
        _file(("dash", ["t-*"]), ("under", ["t_*"]), ("dot", ["t.*"]), ("sl", ["t/*"])),
    ),
    ("distinct exact ids", _file(("x", ["eval-x"]), ("y", ["eval-y", "eval-x2"]))),
    ("an exact id beside a prefix it does not start with", _file(("a", ["a-*"]), ("b", ["ab", "b-*"]))),
    ("entries of one scope may overlap each other", _file(("rl", ["grpo-*", "grpo-qwen", "grpo-qwen-*"]))),
    ("a prefix that is only a separator", _file(("odd", ["-*"]), ("rest", ["team-*"]))),
]
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "the same exact id",
        _file(("a", ["shared"]), ("b", ["shared"])),
        "'shared' and 'shared' both match experiment 'shared'",
    ),
    ("the same prefix", _file(("a", ["shared-*"]), ("b", ["x", "shared-*"])), r"'shared-\*' and 'shared-\*'"),
    ("an id under another's prefix", _file(("a", ["team-a-*"]), ("b", ["team-a-x"])), r"'team-a-\*' and 'team-a-x'"),
    ("an id that is another's prefix's text", _file(("a", ["team-a-"]), ("b", ["team-a-*"])), "experiment 'team-a-'"),
    (
        "a prefix under another's",
        _file(("a", ["team-a-*"]), ("b", ["team-a-b-*"])),
        "both match experiment 'team-a-b-'",
    ),
    ("the lone * beside another scope", _file(("all", ["*"]), ("b", ["b-x"])), r"'\*' and 'b-x'"),
    ("two lone *", _file(("all", ["*"]), ("too", ["*"])), "both match every experiment"),
    (
        "an overlap between the 2nd and 3rd scope",
        _file(("a", ["a-*"]), ("b", ["b-*"]), ("c", ["b-c-*"])),
        "scope 'b' and scope 'c'",
    ),
    ("a prefix without its separator", _file(("a", ["team-a*"])), r"no separator before its '\*'.*write 'team-a-\*'"),
    ("a prefix without its separator, alone", _file(("rl", ["grpo*"])), r"write 'grpo-\*'"),
    ("an id holding a control character", _file(("a", ["new\nline"])), "control characters"),
    ("an id past the edge's bound", _file(("a", ["x" * 257])), "of 257 characters"),
]


@pytest.mark.parametrize(("why", "found"), ACCEPTED, ids=[why for why, _ in ACCEPTED])
def test_a_token_file_whose_scopes_share_no_experiment_loads(tmp_path: Path, why: str, found: dict[str, Any]) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(found))
    scopes = list(dict.fromkeys(load_tokens(path).values()))
    assert [s.name for s in scopes] == list(found["scopes"]), why
    assert all(a.overlap(b) is None for i, a in enumerate(scopes) for b in scopes[i + 1 :]), why


@pytest.mark.parametrize(("why", "found", "said"), REFUSED, ids=[why for why, _, _ in REFUSED])
def test_a_token_file_whose_scopes_can_share_an_experiment_is_refused(
    tmp_path: Path, why: str, found: dict[str, Any], said: str
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(found))
    with pytest.raises(ValueError, match=said) as refused:
        load_tokens(path)
    assert str(refused.value).startswith(f"{path}: "), why  # the file named first
    if "overlap" in str(refused.value):
        first, second = (name for name in found["scopes"] if f"scope {name!r}" in str(refused.value))
        assert f"scope {first!r} and scope {second!r} overlap: " in str(refused.value), why


def test_an_overlap_is_found_exactly_when_one_id_is_allowed_by_both_scopes() -> None:
    """``Scope.overlap`` against ``Scope.allows`` over every pair of entries: an overlap's example
    id is allowed by both, and where none is found no id built from the entries is allowed by both
    (experiment ids are any clean text, so the ids tried hold separators, stars, spaces and more)."""
    entries = [
        "*",
        "-*",
        "a",
        "a-",
        "a-*",
        "a-b",
        "a-b-*",
        "a_*",
        "a/*",
        "a.*",
        "ab",
        "ab-*",
        "b-*",
        "a*",
        "a b",
    ]
    ids = {"", "a", "ab", "a*", "a-*x", " ", "a b", "\u00e9"}
    for entry in entries:
        text = entry.removesuffix("*")
        ids |= {text, text + "x", text + "-", text + "*", text[:-1], text + "b-x"}
    for one in entries:
        for other in entries:
            a, b = Scope("a", (one,)), Scope("b", (other,))
            found = a.overlap(b)
            both = {i for i in ids if a.allows(i) and b.allows(i)}
            if found is None:
                assert both == set(), (one, other, both)
            else:
                assert found[:2] == (one, other) and a.allows(found[2]) and b.allows(found[2]), (one, other, found)
                assert all(len(i) >= len(found[2]) for i in both), (one, other, found)  # the shortest
            assert (found is None) == (b.overlap(a) is None), (one, other)  # symmetric


def test_keys_refuse_overlapping_scopes_given_without_a_file() -> None:
    with pytest.raises(ValueError, match="scope 'a' and scope 'ab' overlap: 'team-a-\\*' and 'team-a-b'"):
        Keys(None, {SECRET: Scope("a", ("team-a-*",)), SECRET + "2": Scope("ab", ("team-a-b",))})
    keys = Keys(None, {SECRET: Scope("a", ("team-a-*",)), SECRET + "2": Scope("ab", ("team-ab-*",))})
    assert keys.scope_of(f"Bearer {SECRET}2") == Scope("ab", ("team-ab-*",))


def test_run_notes_are_kept_per_scope_and_a_flood_of_one_scope_leaves_anothers() -> None:
    notes = Notes(interval=10.0, shown=3, clock=lambda: 100.0)
    notes.add("resume: experiment 'team-a-x' has no run to continue; run 'r1' is new", "a")
    for i in range(200):  # another scope's flood of one kind, and of kinds
        notes.add(f"resume: experiment 'team-ab-x' has no run 'gone-{i}'", "ab")
        notes.add(f"kind: something else {string.ascii_letters[i // 52]}{string.ascii_letters[i % 52]}", "ab")
    notes.add("replaying run x: 1 points refused")  # the sink's own
    assert notes.listed("a") == ["resume: experiment 'team-a-x' has no run to continue; run 'r1' is new"]
    assert notes.listed("ab")[-1] == "kind: something else dR" and len(notes.listed("ab")) == 3
    assert not any("team-a-x" in n or "team-ab" in n for n in notes.listed(""))
    assert notes.listed()[-1] == "replaying run x: 1 points refused"  # everyone's, for the sink's --token


def test_the_overview_of_a_sink_lists_each_scopes_own_runs_and_notes(tmp_path: Path) -> None:
    """A sink that listens on no port: the overview through each token's port (``scoped``)."""
    a, ab = Scope("a", ("team-a-*", "team-a")), Scope("ab", ("team-ab-*",))
    sink = Sink(SinkConfig(grpc_port=None, http_port=None, state_dir=None)).start()
    try:
        for scope, experiment in ((ab, "team-ab-x"), (ab, "team-ab-y"), (a, "team-a-x"), (ALL, "admins")):
            assert sink.export_metrics(_parsed(step_request(experiment, "r", 0, 0)), Client(scope=scope)).rejected == 0
        latest = step_request("team-ab-x", "r2", 0, 0)
        latest.resource_metrics[0].resource.attributes.append(key_value(attr.RUN_RESUME, "latest"))
        sink.export_metrics(_parsed(latest), Client(scope=ab))  # a run note of scope ab's: it names team-ab-x
        control = Control(sink.queries, sink.commands)
        mine, theirs = scoped(control, a).queries.overview(), scoped(control, ab).queries.overview()
        assert [e["id"] for e in mine["experiment_list"]] == ["team-a-x"] and (mine["experiments"], mine["runs"]) == (
            1,
            1,
        )
        assert mine["run_notes"] == [] and "refusals" not in mine and "descriptors" not in mine
        assert [e["id"] for e in theirs["experiment_list"]] == ["team-ab-x", "team-ab-x", "team-ab-y"]
        assert any("team-ab-x" in n for n in theirs["run_notes"]), theirs["run_notes"]
        everything = control.queries.overview()
        assert everything["experiments"] == 4 and any("team-ab-x" in n for n in everything["run_notes"])
        assert "refusals" in everything and "descriptors" in everything
    finally:
        sink.stop()


def _parsed(request: Any) -> Any:
    """An export as the transports hand it to the sink (``otlp.raw.parse_metrics``)."""
    return parse_metrics(request.SerializeToString())


def test_rankscope_sink_takes_a_token_file_from_its_flag_or_the_environment(tmp_path: Path, monkeypatch) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[scopes.rl]\ntoken = "{SECRET}"\nexperiments = ["grpo-*"]\n')
    parser = build_parser()
    config = sink_config(parser.parse_args(["sink", "--tokens", str(tokens), "--no-state-dir"]))
    assert config.transport.tokens == {SECRET: Scope("rl", ("grpo-*",))}
    monkeypatch.setenv("RANKSCOPE_SINK_TOKENS", str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match=r"missing\.toml"):
        sink_config(parser.parse_args(["sink", "--no-state-dir"]))
    assert sink_config(parser.parse_args(["run", "--", "true"])).transport.tokens == {}  # one job's own sink: none


class _Port:
    """A Control port that answers as if it held every experiment."""

    def health(self) -> tuple[bool, list[str]]:
        return True, []

    def configure(self, experiment_id: str, backends: Any) -> str:
        return "ok"

    def __init__(self) -> None:
        self.asked: list[Scope] = []

    def overview(self, scope: Scope = ALL) -> dict[str, Any]:
        self.asked.append(scope)
        return {
            "healthy": True,
            "experiment_list": [{"id": "grpo-a"}, {"id": "theirs"}],
            "runs": 2,
            "run_notes": ["a note of its own"],
            "refusals": {"experiment … is not among those of this token's scope …": 3},
            "refused_points": 3,
            "connections": {"closed": 1},
            "admission": {"max_open": 4096, "per_client": 512, "clients": 7, "refused_runs": {"client": 1}},
        }

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        runs = [{"run": "a", "scope": "rl"}, {"run": "b", "scope": ""}, {"run": "c", "scope": "vision"}]
        return {"experiment": experiment_id, "client": "scope vision", "runs": runs}

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None:
        return []

    def span_rows(self, experiment_id: str, *args: Any) -> Any:
        return iter(())

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | str:
        return ["page.html"]

    def capture(self, experiment_id: str, *args: Any) -> dict[str, Any] | str:
        return {"id": "c"}

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]:
        return [{"id": "c"}]

    def capture_target(self, experiment_id: str, *args: Any) -> Path:
        return Path("x")

    def store_capture(self, experiment_id: str, *args: Any) -> str:
        return "x"


def test_a_scoped_token_sees_its_own_experiments_only() -> None:
    port = _Port()
    seen = scoped(Control(port, port), Scope("rl", ("grpo-*",)))  # type: ignore[arg-type]
    read, control = seen.queries, seen.commands
    assert read.status("grpo-a") is not None and read.status("theirs") is None
    assert read.recent("theirs") is None and read.span_rows(SpanQuery("theirs")) is None
    assert control.pending_captures("theirs", "p") == [] and control.pending_captures("grpo-a", "p") != []
    assert str(control.report("theirs")).startswith("no experiment 'theirs'")
    assert str(control.capture("theirs", "asked", 2)).startswith("no experiment")
    assert control.configure("theirs", {}).startswith("refused: scope 'rl' may not write")
    assert control.configure("grpo-a", {}) == "ok"
    for call in (read.capture_target, control.store_capture):
        with pytest.raises(LookupError):
            call("theirs", "c", "p", 1)  # type: ignore[operator]
    assert read.overview()["experiment_list"] == [{"id": "grpo-a"}]


def test_a_scoped_overview_holds_its_own_runs_and_notes_and_no_sink_wide_count() -> None:
    port = _Port()
    rl = Scope("rl", ("grpo-*",))
    seen = scoped(Control(port, port), rl)  # type: ignore[arg-type]
    assert seen.queries.overview(ALL) == {  # asked for everything, it still answers for its own scope
        "scope": "rl",
        "healthy": True,
        "runs": 2,
        "experiment_list": [{"id": "grpo-a"}],
        "run_notes": ["a note of its own"],
        "admission": {"max_open": 4096, "per_client": 512},  # the limits, not who holds runs
    }
    assert port.asked == [rl]  # the sink lists the scope's runs and notes before it cuts the list
    status = seen.queries.status("grpo-a")
    assert status is not None and status["client"] == "another scope"
    assert [(r["run"], r["scope"]) for r in status["runs"]] == [("a", "rl"), ("b", ""), ("c", "another scope")]
    assert port.status("grpo-a")["runs"][2]["scope"] == "vision"  # type: ignore[index]  # a copy was masked
