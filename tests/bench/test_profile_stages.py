"""bench/profile_stages.py: py-spy raw samples are attributed to the innermost stage (or the
publish phase, the dedup table, the worker loop, aiokafka, Faust), setup, start-up and idle
samples are left out, the before/after table adds up and `detail` names the worker's lines."""

from __future__ import annotations

from pathlib import Path

from bench.profile_stages import categorize, detail, load, main, producer_headers, report

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


def test_start_up_is_left_out_as_the_cpu_per_message_leaves_it_out() -> None:
    """Imports, building the app, tune_gc and the table's open/close on assignment are paid once,
    before the first batch the benchmark times: none of them is a message's cost."""
    for tail in ("<module> (app/sinks/nats.py:41);_find_and_load (<frozen importlib._bootstrap>:1176)",
                 "PipelineApp.__init__ (app/worker/pipeline.py:300);PipelineApp._stages (app/worker/pipeline.py:9)",
                 "tune_gc (app/worker/faust_app.py:248)",
                 "Collection.on_rebalance (faust/tables/base.py:631);Store.on_rebalance (faust/stores/rocksdb.py:565)",
                 "Store._try_open_db_for_partition (faust/stores/rocksdb.py:624);"
                 "Store._open_for_partition (faust/stores/rocksdb.py:491)"):
        assert categorize(f"{RUN};{tail}".split(";")) is None, tail
    # the same modules at work on a message still count
    assert categorize(f"{RUN};send_batched (app/worker/batch_send.py:157)".split(";")).startswith("worker loop")


def test_detail_names_the_innermost_worker_line_and_its_callee(tmp_path: Path) -> None:
    loop = "main (bench/x.py:1);BatchSource.run (app/worker/batch_source.py:221)"
    raw = _raw(tmp_path, "w.txt", [
        (f"{loop};send_batched (app/worker/batch_send.py:157);BatchBuilder.append (aiokafka/producer/m.py:77)", 30),
        (f"{loop}", 10),
        (f"{loop};Normalize.process (app/agents/normalize.py:1)", 60),
        (f"{loop};_find_and_load (<frozen importlib._bootstrap>:1176)", 500),  # start-up: not counted
    ])
    table = detail(raw, "worker loop")
    assert "| send_batched (batch_send.py:157) -> BatchBuilder.append | 30.0 |" in table
    assert "| BatchSource.run (batch_source.py:221) -> self | 10.0 |" in table
    assert "Normalize" not in table
    assert main(["detail", str(raw), "worker loop", "--top", "1"]) == 0


def test_producer_headers_are_ordinary_ones() -> None:
    """`--headers N`: N headers a live producer sets (`bench-sent` first, as the latency client
    sends it), none of which Prism reads or regenerates - the cost measured is the plain one."""
    from app.bindings import kafka
    from app.formats._fields import AUTH_HEADERS

    assert producer_headers(0) is None
    hs = producer_headers(4)
    assert hs is not None and len(hs) == 4 and hs[0][0] == "bench-sent"
    names = [n.lower() for n, _ in hs]
    assert len(set(names)) == 4 and all(isinstance(v, bytes) and v for _, v in hs)
    assert not any(kafka.is_owned(n) or n in kafka._REGENERATED or n in AUTH_HEADERS or n.startswith("ce_")
                   for n in names)
