// A source connector for tests/kafka/test_connect_parity.py, compiled by tests/kafka/connect.py
// against the Connect jars under test.
//
// Why our own: since Kafka 4.0 connect-runtime ships no connector (its Mock/Verifiable ones moved to
// an unpublished test jar), and connect-file 4.3.1 - Maven Central has no 4.4.0 - calls a class
// kafka-clients 4.4.0 no longer has.  This one needs connect-api only.  Its task writes one record
// to `topic` (so GET /connectors/{name}/topics has something to list), then idles; with
// `mode=fail-task` the task fails on start (a FAILED task, for restart?onlyFailed=true).
package prism.test;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.source.SourceConnector;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

public class ParityTestConnector extends SourceConnector {
    private Map<String, String> props;

    @Override public String version() { return "1.0"; }

    @Override public void start(Map<String, String> props) { this.props = new HashMap<>(props); }

    @Override public Class<? extends Task> taskClass() { return ParityTestTask.class; }

    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        List<Map<String, String>> configs = new ArrayList<>();
        for (int i = 0; i < maxTasks; i++) {
            configs.add(new HashMap<>(props));
        }
        return configs;
    }

    @Override public void stop() { }

    @Override public ConfigDef config() {
        return new ConfigDef()
            .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "where the task writes one record")
            .define("mode", ConfigDef.Type.STRING, "run", ConfigDef.Importance.LOW, "run | fail-task");
    }

    public static class ParityTestTask extends SourceTask {
        private String topic;
        private boolean sent;

        @Override public String version() { return "1.0"; }

        @Override public void start(Map<String, String> props) {
            if ("fail-task".equals(props.get("mode"))) {
                throw new ConnectException("parity test: this task fails on purpose");
            }
            topic = props.get("topic");
        }

        @Override public List<SourceRecord> poll() throws InterruptedException {
            if (sent) {
                Thread.sleep(200);
                return null;
            }
            sent = true;
            return Collections.singletonList(new SourceRecord(Collections.singletonMap("source", "parity"),
                Collections.singletonMap("position", 0L), topic, Schema.STRING_SCHEMA, "hello"));
        }

        @Override public void stop() { }
    }
}
