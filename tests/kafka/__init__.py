"""A real Apache Kafka (KRaft, fetched from Maven Central) for the tests: helper, fixtures, tests."""
