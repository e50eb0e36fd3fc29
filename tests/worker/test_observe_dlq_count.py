"""`prism_dlq_messages_total` counts each DLQ record exactly once (app/worker/observe.py).

What this guards: `prism status` showed `dlq 9` against 7 DLQ records, `token_expired` counted at
`authenticate` and again at `publish`. The worker counts a batch only after its writes, and by
then the next batch has already run through the chain; the publish-stage count was inferred as
"DLQ records since the last count minus this batch's results", so the next batch's records were
counted once as publish failures and again with their own batch. Now only the final writes'
failures that miss their batch's results (`late=True`) are counted at publish."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.agents.base import Message
from app.agents.chain import Chain
from app.errors import SinkError, TokenExpiredError
from app.observability.metrics import PipelineMetrics
from app.worker.observe import Observer


class _Expired:
    """An authenticate stage whose tokens have all expired."""

    name = "authenticate"

    def process(self, msg: Message) -> None:
        raise TokenExpiredError("token expired", path="Authorization")


def _dlq_counts(obs: Observer) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(obs.metrics.exposition().decode()):
        for s in fam.samples:
            if s.name == "prism_dlq_messages_total":
                key = (s.labels["stage"], s.labels["reason"])
                out[key] = out.get(key, 0) + s.value
    return out


def _run(chain: Chain, first: int, n: int) -> list[tuple[Message, object]]:
    return [(m, chain.run(m)) for m in (Message(topic="t", partition=0, offset=first + i, value=b"{}")
                                        for i in range(n))]


def test_a_batch_counted_after_the_next_one_ran_is_counted_once() -> None:
    chain = Chain([_Expired()], dlq_topic_for=lambda t: t + ".dlq")
    obs = Observer(metrics=PipelineMetrics())
    a = _run(chain, 0, 3)
    b = _run(chain, 3, 4)  # the next batch runs through the chain while the first still writes
    obs._count_batch(chain, "t", a)
    obs._count_batch(chain, "t", b)
    assert _dlq_counts(obs) == {("authenticate", "token_expired"): 7.0}
    assert chain.stats.dlq_reasons["token_expired"] == 7


def test_a_late_final_write_failure_is_counted_once_at_publish() -> None:
    chain = Chain([_Expired()], dlq_topic_for=lambda t: t + ".dlq")
    obs = Observer(metrics=PipelineMetrics())
    a = _run(chain, 0, 2)
    chain.dlq_for_publish_failure(Message(topic="t", partition=0, offset=9, value=b"{}"),
                                  SinkError("writing outputs failed"), late=True)
    obs._count_batch(chain, "t", a)
    obs._count_batch(chain, "t", _run(chain, 10, 1))
    assert _dlq_counts(obs) == {("authenticate", "token_expired"): 3.0, ("publish", "sink_failed"): 1.0}


def _all_counts(obs: Observer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every Prism counter sample of the exposition. Histograms are left out (their buckets are
    timings), and so are the process and gc collectors' counters: CPU seconds and collections move
    between two reads of the same registry, so they would make the comparison flaky."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(obs.metrics.exposition().decode()):
        if fam.type != "counter":
            continue
        for s in fam.samples:
            if s.name.startswith("prism_") and s.name.endswith("_total"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_batches_counted_together_give_the_sums_of_counting_each() -> None:
    """at_least_once counts an interval's batches in one pass (`count_batches`,
    app/worker/batch_runner.py `count_every_s`): the same counter values as one `batch_done`
    per batch, and every batch leaves the in-flight count as it finishes."""
    chain_a = Chain([_Expired()], dlq_topic_for=lambda t: t + ".dlq")
    chain_b = Chain([_Expired()], dlq_topic_for=lambda t: t + ".dlq")
    each, together = Observer(metrics=PipelineMetrics()), Observer(metrics=PipelineMetrics())
    batches_a = [_run(chain_a, 0, 3), _run(chain_a, 3, 1), _run(chain_a, 4, 5)]
    batches_b = [_run(chain_b, 0, 3), _run(chain_b, 3, 1), _run(chain_b, 4, 5)]
    for b in batches_a:
        each.batch_started()
        each.batch_done(chain_a, "t", b)
    for _ in batches_b:
        together.batch_started()
    assert together.in_flight == 3
    for _ in batches_b:
        together.batch_finished()
    assert together.in_flight == 0 and together.batches == 3 and together._idle.is_set()
    together.count_batches(chain_b, "t", [r for b in batches_b for r in b])
    assert _all_counts(together) == _all_counts(each) and _all_counts(each)
    assert _dlq_counts(together) == {("authenticate", "token_expired"): 9.0}
