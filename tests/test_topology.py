"""Topology keys added for source retention and DLQ attestations: parsed, defaulted, and
refused with the key path when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.topology import load_topology, parse_duration_ms

ROOT = Path(__file__).resolve().parents[1]


def _load(tmp_path: Path, source: dict | None = None, dlq: dict | None = None):
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["sources"][0].update(source or {})
    doc["dlq"].update(dlq or {})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


@pytest.mark.parametrize("text, ms", [("500ms", 500), ("90s", 90_000), ("30m", 1_800_000), ("1h", 3_600_000),
                                      (" 2d ", 172_800_000), (60_000, 60_000)])
def test_durations(text, ms) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "1", "1w", "-1h", "1.5h", "0m", True, 0, "h1"])
def test_bad_durations(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)


def test_source_retention_default_override_and_opt_out(tmp_path: Path) -> None:
    t = _load(tmp_path)
    assert t.topic_configs() == {"orders.created": {"retention.ms": "86400000"}}
    assert t.topic_configs(source_retention_ms=3_600_000) == {"orders.created": {"retention.ms": "3600000"}}
    assert _load(tmp_path, {"retention": "1h"}).source_retention_limits() == {"orders.created": 3_600_000}
    assert _load(tmp_path, {"retention": None}).topic_configs() == {}


@pytest.mark.parametrize("value, what", [("30s", "under one minute"), ("forever", "not a duration")])
def test_bad_source_retention_names_the_key(tmp_path: Path, value, what) -> None:
    with pytest.raises(ConfigError, match=rf"sources\[0\]\.retention.*{what}"):
        _load(tmp_path, {"retention": value})


def test_dlq_attestation_settings(tmp_path: Path) -> None:
    t = _load(tmp_path)
    assert t.dlq.attestation.enabled and t.dlq.attestation.max_age_s == 7 * 86400
    t = _load(tmp_path, dlq={"attestation": {"max_age_s": 3600, "trusted_keys": ["prism-worker-0"]}})
    assert t.dlq.attestation.trusted_keys == ["prism-worker-0"]
    with pytest.raises(ConfigError, match="max_age_s"):
        _load(tmp_path, dlq={"attestation": {"max_age_s": 5}})
    with pytest.raises(ConfigError, match=r"dlq\.attestation\.trust_everyone: unknown key"):
        _load(tmp_path, dlq={"attestation": {"trust_everyone": True}})


def test_output_signature_scope_defaults_to_batch_and_accepts_only_known_scopes(tmp_path: Path) -> None:
    assert _load(tmp_path).outputs.signature_scope == "batch"
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    for value, ok in (("v2", True), ("pair", True), ("batch", True), ("legacy", False), ("v3", False)):
        doc["outputs"]["signature_scope"] = value
        path = tmp_path / f"scope-{value}.yaml"
        path.write_text(yaml.safe_dump(doc))
        if ok:
            assert load_topology(path).outputs.signature_scope == value
        else:
            with pytest.raises(ConfigError, match=r"outputs\.signature_scope"):
                load_topology(path)


@pytest.mark.parametrize("value", [999, 900_001, "soon"])
def test_transaction_timeout_out_of_range_names_the_key(tmp_path: Path, value) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["transaction_timeout_ms"] = value
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="transaction_timeout_ms"):
        load_topology(path)
    doc["transaction_timeout_ms"] = 5_000
    path.write_text(yaml.safe_dump(doc))
    assert load_topology(path).transaction_timeout_ms == 5_000


def test_archive_roll_interval_is_bounded(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["archive"]["roll_interval_s"] = 0.5
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"archive\.roll_interval_s"):
        load_topology(path)
    doc["archive"]["roll_interval_s"] = 5
    path.write_text(yaml.safe_dump(doc))
    assert load_topology(path).archive.roll_interval_s == 5


def _shipped_with(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load((Path(__file__).parent.parent / "topologies/orders-created.yaml").read_text())
    edit(doc)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    """A bad stage setting no longer hides a bad source setting (issue 28: `partitions: -2` was
    reported only after `window_s: one hour` was fixed), nor one check across keys another."""
    from app.errors import ConfigProblems

    def two_fields(doc: dict) -> None:
        doc["stages"][5]["dedup"]["window_s"] = "one hour"
        doc["stages"][1]["validate"]["max_age_days"] = 0
        doc["sources"][0]["partitions"] = -2

    with pytest.raises(ConfigProblems) as err:
        load_topology(_shipped_with(tmp_path, two_fields))
    lines = [p.message for p in err.value.problems]
    assert len(lines) == 3, lines
    assert any("stages[5].dedup.window_s" in m for m in lines)
    assert any("stages[1].validate.max_age_days" in m for m in lines)
    assert any("sources[0].partitions" in m for m in lines)
    assert all(p.code == "bad_config" and "\n" not in str(p) for p in err.value.problems)
    assert "3 problem(s)" in str(err.value)

    def two_checks(doc: dict) -> None:
        doc["sources"].append(dict(doc["sources"][0]))  # the same topic twice
        doc["producers"][0]["topics"] = ["not-a-source"]

    with pytest.raises(ConfigProblems) as err:
        load_topology(_shipped_with(tmp_path, two_checks))
    lines = [p.message for p in err.value.problems]
    assert len(lines) == 2 and "listed twice" in lines[0] and "producers[0].topics" in lines[1], lines


def test_one_problem_is_one_config_error(tmp_path: Path) -> None:
    def one(doc: dict) -> None:
        doc["stages"].append({"no_such_stage": {}})

    with pytest.raises(ConfigError) as err:
        load_topology(_shipped_with(tmp_path, one))
    assert not hasattr(err.value, "problems") and "unknown stage 'no_such_stage'" in str(err.value)


def test_cli_prints_one_error_line_per_problem(tmp_path: Path) -> None:
    """`prism run`: one `error [bad_config]` line each, then how many, and nothing started."""
    import os
    import subprocess
    import sys

    def bad(doc: dict) -> None:
        doc["stages"][5]["dedup"]["window_s"] = "one hour"
        doc["sources"][0]["partitions"] = -2

    path = _shipped_with(tmp_path, bad)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}
    out = subprocess.run([sys.executable, "-m", "app.cli.main", "run", "--topology", str(path)], env=env,
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error [bad_config]")]
    assert len(errors) == 2 and "window_s" in errors[0] and "partitions" in errors[1], out.stderr
    assert out.stderr.strip().splitlines()[-1] == "2 configuration problems; nothing was started"


# --------------------------------------------------------------------------- a new user's and an attacker's files


def _problems(path: Path) -> list[ConfigError]:
    """Every problem `load_topology` reports for `path` (one or several)."""
    with pytest.raises(ConfigError) as err:
        load_topology(path)
    return list(getattr(err.value, "problems", [err.value]))


@pytest.mark.parametrize("edit, where, why", [
    # YAML gives these types: they were taken as 1, 4 and 3600 (pydantic's lax mode)
    (lambda d: d["sources"][0].update(partitions=True), "sources[0].partitions",
     "should be a whole number, not the boolean true"),
    (lambda d: d["sources"][0].update(partitions="4"), "sources[0].partitions",
     "should be a whole number, not the text '4' - write the number without quotes"),
    (lambda d: d["stages"][5]["dedup"].update(window_s=3600.0), "stages[5].dedup.window_s",
     "should be a whole number, not the number 3600.0"),
    # YAML makes a date of 2024-01-01 and null of an empty value
    (lambda d: d.update(name=__import__("datetime").date(2024, 1, 1)), "name",
     "should be text, not a date (2024-01-01) - YAML reads dates: quote it"),
    (lambda d: d.update(namespace=None), "namespace", "should be text, not empty (YAML null): give a value"),
    # NaN was "less than or equal to 3600"
    (lambda d: d["archive"].update(roll_interval_s=float("nan")), "archive.roll_interval_s", "finite number"),
    (lambda d: d["sources"][0].update(retention=1.5), "sources[0].retention", "is not a duration"),
    (lambda d: d["sources"][0].update(retention=10**30), "sources[0].retention", "longer than Kafka takes"),
    (lambda d: d["sources"][0].update(topic=".."), "sources[0].topic", "not a Kafka topic name"),
    (lambda d: d.update(namespace=""), "namespace", "at least 1 character"),
    (lambda d: d["archive"].update(path=""), "archive.path", "at least 1 character"),
    (lambda d: d["stages"][1]["validate"].update(max_age_days=10**30), "stages[1].validate.max_age_days",
     "less than or equal to 36500"),
    # caught only at start-up, one per start, under the JWT settings' keys (jwt.issuers ...)
    (lambda d: d["stages"][2]["authenticate"].update(issuer=[]), "stages[2].authenticate.issuer", "is not an issuer"),
    (lambda d: d["stages"][2]["authenticate"].update(algorithms=[]), "stages[2].authenticate.algorithms",
     "at least 1 item"),
    (lambda d: d["stages"][2]["authenticate"].update(publisher_id_claim=""),
     "stages[2].authenticate.publisher_id_claim", "at least 1 character"),
    # `keyring: ""` was "no keyring is configured"
    (lambda d: d["stages"][3]["verify_signature"].update(keyring=""), "stages[3].verify_signature.keyring",
     "at least 1 character"),
    # [] was read as no list: every algorithm allowed
    (lambda d: d["stages"][4]["policy"].update(allowed_algorithms=[]), "stages[4].policy",
     "allowed_algorithms is an empty list"),
    (lambda d: d["stages"][4]["policy"].update(allowed_algorithms=["rot13"]), "stages[4].policy",
     "allowed_algorithms: algorithm 'rot13' is not supported"),
    (lambda d: d["stages"][4]["policy"].update(allowed_algorithms=["chacha20-poly1305"], fips_mode=True),
     "stages[4].policy", "fips_mode forbids"),
    # the resolver tells the format by the extension, and its error said "pass --format"
    (lambda d: d["stages"][6]["enrich"]["schema"].update(path="/dev/zero"), "stages[6].enrich.schema",
     "told by its file extension"),
    (lambda d: d["archive"].update(topic="bad topic"), "archive.topic",
     "'bad topic' is not allowed here: use letters, digits, '.', '_' and '-' (a Kafka topic name)"),
    (lambda d: d["dlq"].update(backoff_initial_ms=5000, backoff_max_ms=10), "dlq", "larger than backoff_max_ms"),
    (lambda d: d["dlq"].update(backoff_max_ms=10**18), "dlq.backoff_max_ms", "less than or equal to 600000"),
    # an empty suffix made the DLQ the source topic itself: failed records were read again, forever
    (lambda d: d["dlq"].update(topic_suffix=""), "dlq.topic_suffix", "at least 2 characters"),
    (lambda d: d["dlq"].update(topic_suffix="/../x"), "dlq.topic_suffix",
     "'/../x' is not allowed here: use '.', '_' or '-' then"),
    (lambda d: d["dlq"].update(topic_suffix=".v3"), "dlq.topic_suffix",
     "'orders.created.v3' is the v3 output of sources[0] and the DLQ of sources[0]"),
    (lambda d: d["archive"].update(topic="orders.created"), "archive.topic",
     "'orders.created' is sources[0].topic and archive.topic"),
    (lambda d: d["sources"].append({"topic": "orders.created.dlq"}), "sources[1].topic",
     "'orders.created.dlq' is the DLQ of sources[0] and sources[1].topic"),
    (lambda d: d["sources"].append({"topic": "orders_created"}), "",
     "'orders.created' and 'orders_created' differ only by '.' against '_'"),
])
def test_values_that_would_misbehave_later_are_refused_at_load(tmp_path: Path, edit, where: str, why: str) -> None:
    problems = _problems(_shipped_with(tmp_path, edit))
    assert any(p.message.split(": ", 1)[-1].startswith(f"{where}: ") and why in p.message if where else
               why in p.message for p in problems), [p.message for p in problems]


def test_the_longest_names_a_topology_derives_are_names_kafka_takes(tmp_path: Path) -> None:
    topo = load_topology(_shipped_with(tmp_path, lambda d: (d["sources"][0].update(topic="a" * 200),
                                                              d["dlq"].update(topic_suffix="." + "d" * 31))))
    from app.cli.dlq import ledger_topics

    assert max(len(t) for t in [*topo.topics(), *ledger_topics(topo)]) <= 249


def test_validation_written_on_says_yaml_made_it_a_boolean(tmp_path: Path) -> None:
    text = (ROOT / "topologies/orders-created.yaml").read_text().replace("validation: warn", "validation: on")
    path = tmp_path / "t.yaml"
    path.write_text(text)
    (only,) = _problems(path)
    assert "validation: on / yes / true is YAML for a boolean, not a mode: write warn or strict" in only.message


def test_a_policy_written_off_is_the_word_off(tmp_path: Path) -> None:
    """YAML 1.1 reads a bare `off` as false: `policy: off` was refused as not one of
    'required', 'optional' or 'off' - while saying it may be 'off'."""
    text = (ROOT / "topologies/orders-created.yaml").read_text().replace(
        "      policy: optional    # verify signatures", "      policy: off    # verify signatures")
    path = tmp_path / "t.yaml"
    path.write_text(text.replace("    key_ids: [dev-producer-1]", "    # no key ids"))
    assert load_topology(path).stage("verify_signature").policy == "off"


def test_typos_name_the_key_they_meant_and_every_problem_its_line(tmp_path: Path) -> None:
    """"Extra inputs are not permitted" named neither the key meant nor where the typo was; each
    problem now says which key was likely meant and is at `file:line`."""
    text = (ROOT / "topologies/orders-created.yaml").read_text()
    lines = text.splitlines()
    bad = (text.replace("    partitions: 4", "    partition: 4")
               .replace("  max_attempts: 3", "  max_atempts: 3")
               .replace("      window_s: 3600", "      windows: 3600")
               .replace("  - enrich:", "  - enrichh:"))
    path = tmp_path / "t.yaml"
    path.write_text(bad)
    problems = {p.message.removeprefix("invalid topology: "): p.path for p in _problems(path)}

    def line(start: str) -> str:
        return f"{path}:{next(i for i, ln in enumerate(lines, 1) if ln.startswith(start))}"

    assert problems == {
        "stages[5].dedup.windows: unknown key - did you mean 'window_s'?": line("      window_s: 3600"),
        "stages[6]: unknown stage 'enrichh' - did you mean 'enrich'? (known stages: normalize, validate, "
        "authenticate, verify_signature, policy, dedup, enrich)": line("  - enrich:"),
        "sources[0].partition: unknown key - did you mean 'partitions'?": line("    partitions: 4"),
        "dlq.max_atempts: unknown key - did you mean 'max_attempts'?": line("  max_attempts: 3"),
    }, problems
    # nothing close: the keys allowed there
    path.write_text(text.replace("  max_attempts: 3", "  zzz: 3"))
    (only,) = _problems(path)
    assert "dlq.zzz: unknown key (the keys here: attestation, backoff_initial_ms, backoff_max_ms, max_attempts, " \
           "overflow, topic_suffix)" in only.message and only.path == line("  max_attempts: 3")


@pytest.mark.parametrize("text, what", [("", "is empty"), ("# nothing\n", "is empty"), ("- a\n", "is a list"),
                                        ("hello", "is a single string"), ("42", "is a number")])
def test_a_file_that_is_not_a_mapping_says_what_it_is(tmp_path: Path, text: str, what: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    (only,) = _problems(path)
    assert f"this file {what}" in only.message and "orders-created.yaml" in (only.hint or "")


def test_every_name_rule_of_the_topology_is_said_in_words() -> None:
    """A pattern error said the regular expression (`String should match pattern '^[a-z0-9]...'`);
    each pattern the models use has words in `_PATTERN_WORDS` - a new one must add its own."""
    import re as regex

    from app.topology import _PATTERN_WORDS

    source = (ROOT / "app/topology.py").read_text()
    used = set(regex.findall(r'pattern=r"([^"]+)"', source)) | {r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"}
    assert used and used <= set(_PATTERN_WORDS), used - set(_PATTERN_WORDS)


def test_checking_many_sources_is_linear() -> None:
    """`topics.count(t)` per source and a set of every topic built per source made the checks
    quadratic: 8,000 sources took 7 s to load and a 4 MiB file of them hours. 20,000 sources are
    checked in well under a second now (the bound leaves room for a loaded machine)."""
    import time

    from app.topology import Topology

    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc.pop("producers")
    doc["stages"] = [{"name": "normalize", "settings": {}}]
    doc["validation"] = "off"
    doc["sources"] = [{"topic": f"t{i}"} for i in range(20_000)]
    started = time.monotonic()
    topo = Topology.model_validate(doc)
    assert len(topo.sources) == 20_000 and time.monotonic() - started < 10
