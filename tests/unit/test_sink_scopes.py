"""Scoped tokens as pure parts: the token file, the header to scope, a scope's experiments, and
the control port as a scoped token sees it (``sink.edge.auth``, ``sink.edge.control``). Over real
sockets: ``tests/integration/test_sink_scopes.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankscope.cli.app import build_parser
from rankscope.cli.sink import sink_config
from rankscope.sink.testing import ALL, Control, Keys, Scope, SpanQuery, authorized, load_tokens, scoped

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

    def overview(self) -> dict[str, Any]:
        return {"experiment_list": [{"id": "grpo-a"}, {"id": "theirs"}], "runs": 2}

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        return {"experiment": experiment_id}

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
    assert read.status("grpo-a") == {"experiment": "grpo-a"} and read.status("theirs") is None
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
