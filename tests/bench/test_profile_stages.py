"""bench/profile_stages.py: py-spy raw samples are attributed to the innermost stage (or the
publish phase, the dedup table, the worker loop, aiokafka, Faust), setup and idle samples are
left out, and the before/after table adds up."""

from __future__ import annotations

from pathlib import Path

from bench.profile_stages import categorize, load, main, report

RUN = "main (bench/x.py:1);run (app/worker/pipeline.py:10)"


def _raw(tmp: Path, name: str, lines: list[tuple[str, int]]) -> Path:
    path = tmp / name
    path.write_text("".join(f"{stack} {n}\n" for stack, n in lines))
    return path


def test_samples_go_to_the_innermost_stage_or_phase() -> None:
    assert categorize(f"{RUN};Chain.run (app/agents/chain.py:1);Enrich.process (app/agents/enrich.py:9)"
                      ";validate (app/schema/payload_check.py:3)".split(";")) == "Enrich"
    assert categorize(f"{RUN};Publisher.prepare (app/agents/publish.py:1);sha (hashlib:1)".split(";")).startswith(
        "publish: prepare")
    assert categorize(f"{RUN};send (aiokafka/producer.py:1)".split(";")) == "worker loop (app/worker, outside the stages)"
    assert categorize(["loop (x:1)", "send (aiokafka/producer.py:1)"]) == "aiokafka (fetch, produce, commit)"
    assert categorize(["worker (bench/bench_stages.py:1)", "make_messages (bench/bench_pipeline.py:2)"]) is None
    assert categorize(["t (threading.py:1)", "ServiceThread._start_thread (mode/threads.py:3)"]) is None


def test_report_adds_up_and_splits_enrich(tmp_path: Path) -> None:
    enrich = f"{RUN};Enrich.process (app/agents/enrich.py:9)"
    before = _raw(tmp_path, "before.txt", [(enrich + ";Parse (google/protobuf/json_format.py:1)", 60),
                                           (f"{RUN};Publisher.prepare (app/agents/publish.py:1)", 40)])
    after = _raw(tmp_path, "after.txt", [(enrich + ";Parse (google/protobuf/json_format.py:1)", 20),
                                         (f"{RUN};Publisher.prepare (app/agents/publish.py:1)", 80)])
    parts, sub = load(before)
    assert parts["Enrich"] == 60 and sub["  enrich: payload validation"] == 60
    table = report([before, after], [200.0, 100.0])
    assert "| Enrich | 60.0 | 20.0 | 120 | 20 |" in table
    assert "| enrich: payload validation | 60.0 | 20.0 | | |" in table
    assert "samples: 100, 100" in table


def test_the_command_line_refuses_a_wrong_number_of_figures(tmp_path: Path, capsys) -> None:
    raw = _raw(tmp_path, "a.txt", [(f"{RUN};Normalize.process (app/agents/normalize.py:1)", 5)])
    assert main(["report", str(raw)]) == 0
    assert "| Normalize | 100.0 |" in capsys.readouterr().out
    try:
        main(["report", str(raw), "--us", "1", "2"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--us with two figures for one file was accepted")
