// The Kafka Connect contender of bench/bench_peers.py (--broker kafka): a topic-to-topic pipeline on
// a distributed Connect worker, compiled by bench/_brokers.py with tests/kafka/connect.py's
// compile_plugin against the Connect jars it runs on.
//
// Why our own connector and not MirrorMaker 2's MirrorSourceConnector: connect-mirror is not on
// Maven Central for Kafka 4.4.0 (4.3.1 is the newest there), and MirrorSourceTask hands its records
// to the converters and transforms as opaque bytes - no stock single-message transform parses JSON,
// so MM2 + InsertField/ReplaceField cannot do the peers' work (parse, change, serialize).  This task
// does what MirrorSourceTask does - assign every partition of the source topic, keep its positions in
// Connect's offset storage (not a consumer group), copy key and timestamp - and parses each value
// with Connect's own JsonConverter (schemas.enable=false, as a sink connector's value converter
// would).  The change is Connect's: the connector's SMT chain (InsertField$Value, ReplaceField$Value)
// works on the parsed map, and the worker's JsonConverter serializes it again; Connect's producer
// writes it, and Connect commits the positions once the writes are acknowledged (at-least-once).
package prism.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceConnector;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

public class TopicSourceConnector extends SourceConnector {
    private Map<String, String> props;

    @Override public String version() { return "1.0"; }

    @Override public void start(Map<String, String> props) { this.props = new HashMap<>(props); }

    @Override public Class<? extends Task> taskClass() { return TopicSourceTask.class; }

    // One task: each peer is one process, and one task reads every partition (as one peer does).
    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(new HashMap<>(props));
    }

    @Override public void stop() { }

    @Override public ConfigDef config() {
        return new ConfigDef()
            .define("source.topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "the topic read")
            .define("target.topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "the topic written")
            .define("source.bootstrap.servers", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH,
                    "the cluster the source topic is on")
            .define("max.poll.records", ConfigDef.Type.INT, 2000, ConfigDef.Importance.LOW, "records per poll")
            .define("max.partition.fetch.bytes", ConfigDef.Type.INT, 4 * 1024 * 1024, ConfigDef.Importance.LOW,
                    "bytes per partition fetch");
    }

    public static class TopicSourceTask extends SourceTask {
        private KafkaConsumer<byte[], byte[]> consumer;
        private JsonConverter json;
        private String source;
        private String target;
        private volatile boolean stopping;

        @Override public String version() { return "1.0"; }

        private static Map<String, Object> partitionKey(String topic, int partition) {
            Map<String, Object> key = new HashMap<>();
            key.put("topic", topic);
            key.put("partition", partition);
            return key;
        }

        @Override public void start(Map<String, String> props) {
            source = props.get("source.topic");
            target = props.get("target.topic");
            Map<String, Object> cfg = new HashMap<>();
            cfg.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, props.get("source.bootstrap.servers"));
            cfg.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            cfg.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            cfg.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, props.getOrDefault("max.poll.records", "2000"));
            cfg.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG,
                    props.getOrDefault("max.partition.fetch.bytes", String.valueOf(4 * 1024 * 1024)));
            consumer = new KafkaConsumer<>(cfg, new ByteArrayDeserializer(), new ByteArrayDeserializer());
            List<PartitionInfo> infos = consumer.partitionsFor(source, Duration.ofSeconds(30));
            if (infos == null || infos.isEmpty()) {
                throw new ConnectException("source topic " + source + " has no partitions");
            }
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo info : infos) {
                tps.add(new TopicPartition(source, info.partition()));
            }
            consumer.assign(tps);
            for (TopicPartition tp : tps) {  // resume where Connect's offset storage says, else from the start
                Map<String, Object> done = context.offsetStorageReader().offset(partitionKey(source, tp.partition()));
                if (done != null && done.get("offset") != null) {
                    consumer.seek(tp, ((Number) done.get("offset")).longValue() + 1);
                } else {
                    consumer.seekToBeginning(Collections.singletonList(tp));
                }
            }
            json = new JsonConverter();
            Map<String, String> jsonCfg = new HashMap<>();
            jsonCfg.put("schemas.enable", "false");
            json.configure(jsonCfg, false);
        }

        @Override public List<SourceRecord> poll() {
            if (stopping) {
                return null;
            }
            ConsumerRecords<byte[], byte[]> records;
            try {
                records = consumer.poll(Duration.ofMillis(200));
            } catch (WakeupException e) {
                return null;
            }
            if (records.isEmpty()) {
                return null;
            }
            List<SourceRecord> out = new ArrayList<>(records.count());
            for (ConsumerRecord<byte[], byte[]> r : records) {
                SchemaAndValue doc = json.toConnectData(r.topic(), r.value());  // the JSON parse
                out.add(new SourceRecord(partitionKey(r.topic(), r.partition()),
                        Collections.singletonMap("offset", r.offset()), target, null,
                        Schema.OPTIONAL_BYTES_SCHEMA, r.key(), doc.schema(), doc.value(), r.timestamp()));
            }
            return out;
        }

        @Override public void stop() {
            stopping = true;
            if (consumer != null) {
                consumer.wakeup();  // the one thread-safe call: poll() returns, the task thread closes nothing
            }
        }
    }
}
