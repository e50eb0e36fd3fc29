"""The worker's stage tracer under the parent-based sampler: a message whose context says
"not sampled" gets no span at all (not even a non-recording one) and passes its context on
unchanged; sampled messages around it are traced as before. Runs the real `Chain` with
stand-in stages (no broker)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

from app.agents.base import Message, Stage
from app.agents.chain import Chain, Outcome
from app.envelope import decode, encode, new_envelope
from app.observability import tracecontext as tc
from app.observability.tracing import configure_tracing
from app.worker.observe import Observer

TOPIC = "orders.created"


class Decode(Stage):
    name = "normalize"

    def process(self, msg: Message) -> None:
        msg.envelope = decode(msg.value)


class Noop(Stage):
    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, msg: Message) -> None:
        pass


def _chain(setup) -> Chain:
    chain = Chain([Decode(), Noop("validate"), Noop("enrich")], dlq_topic_for=lambda t: t + ".dlq")
    chain.stage_scope = Observer(tracing=setup).stage_tracer
    assert chain.stage_scope is not None
    return chain


def _message(i: int, *, sampled: bool, in_headers: bool = False) -> tuple[Message, str, str]:
    env = new_envelope(TOPIC, {"i": i}, namespace="orders")
    trace_id, span_id = tc.new_trace_id(), tc.new_span_id()
    flags = tc.FLAG_SAMPLED if sampled else 0
    headers = []
    if in_headers:
        headers = tc.trace_headers(trace_id, span_id, flags)
    else:
        tc.write_envelope_context(env, trace_id, span_id, None, flags)
    return Message(TOPIC, 0, i, encode(env), headers=headers), trace_id, span_id


@pytest.fixture
def tracing():
    setup = configure_tracing("memory", "prism-test")  # default sampler: parent-based always-on
    yield setup
    setup.shutdown()


@pytest.mark.parametrize("in_headers", [False, True], ids=["envelope", "headers"])
def test_unsampled_message_gets_no_span_and_keeps_its_context(tracing, in_headers: bool) -> None:
    chain = _chain(tracing)
    msg, trace_id, span_id = _message(1, sampled=False, in_headers=in_headers)
    assert chain.run(msg).outcome is Outcome.EMITTED
    assert tracing.exporter.get_finished_spans() == ()
    obs = msg.env.observability  # passed on unchanged (copied from the headers when only they had it)
    assert (obs.trace_id, obs.span_id, obs.trace_flags & tc.FLAG_SAMPLED) == (trace_id, span_id, 0)


def test_sampled_messages_around_unsampled_ones_are_traced(tracing) -> None:
    chain = _chain(tracing)
    msgs = [_message(i, sampled=i % 2 == 1) for i in range(4)]  # unsampled, sampled, unsampled, sampled
    for msg, _, _ in msgs:
        assert chain.run(msg).outcome is Outcome.EMITTED
    spans = tracing.exporter.get_finished_spans()
    traced = {format(s.context.trace_id, "032x") for s in spans}
    assert traced == {tid for i, (_, tid, _) in enumerate(msgs) if i % 2 == 1}
    for _, tid, parent in msgs[1::2]:
        mine = {s.name.split(" ")[0]: s for s in spans if format(s.context.trace_id, "032x") == tid}
        assert sorted(mine) == ["enrich", "normalize", "validate"]
        assert format(mine["normalize"].parent.span_id, "016x") == parent
        assert mine["validate"].parent.span_id == mine["normalize"].context.span_id
        assert mine["enrich"].parent.span_id == mine["validate"].context.span_id


def test_a_sampler_that_records_unsampled_parents_still_gets_spans() -> None:
    setup = configure_tracing("memory", "prism-test",
                              sampler=ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    try:
        chain = _chain(setup)
        msg, trace_id, _ = _message(1, sampled=False)
        chain.run(msg)
        spans = setup.exporter.get_finished_spans()
        assert len(spans) == 3 and {format(s.context.trace_id, "032x") for s in spans} == {trace_id}
    finally:
        setup.shutdown()
