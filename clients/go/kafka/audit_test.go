package kafka

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
)

func refusedEnv(t *testing.T, id, ns, class string) *envelope.Envelope {
	t.Helper()
	env, err := envelope.NewJSON("orders", ns, map[string]any{"card": "4111"}, envelope.Options{DataClassification: class, MessageID: id})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// The one-message form and the several-message form carry the Python SDK's fields
// (app/sdk/audit.py refusal_record / refusals_record), and never the payload.
func TestRefusalRecordHasThePythonFields(t *testing.T) {
	now := time.UnixMilli(1_760_000_000_123)
	one := newRefusalRecord(refusedEnv(t, "m-1", "order-events", "restricted"),
		[]refusalEntry{{"m-1", "order-events", "restricted", "orders/0@7"}}, "internal", "", "g", now)
	raw, _ := json.Marshal(one)
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"event": "classified_refused", "principal": nil, "group": "g", "message_id": "m-1",
		"namespace": "order-events", "topic": "orders", "classification": "restricted",
		"time": "2025-10-09T08:53:20.123Z", "time_ms": float64(1_760_000_000_123), "backend": "kafka",
		"ref": "orders/0@7", "clearance": "internal"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("one refusal:\n got %v\nwant %v", got, want)
	}
	entries := []refusalEntry{{"m-1", "order-events", "confidential", "orders/0@7"},
		{"m-2", "other-ns", "restricted", "orders/1@3"}}
	several := newRefusalRecord(refusedEnv(t, "m-1", "order-events", "confidential"), entries, "internal", "svc-go", "g", now)
	if several.Classification != "restricted" || several.Count != 2 || *several.Principal != "svc-go" {
		t.Fatalf("several: %+v", several)
	}
	wantMsgs := [][]string{{"m-1", "confidential", "orders/0@7"}, {"m-2", "restricted", "orders/1@3", "other-ns"}}
	if !reflect.DeepEqual(several.Messages, wantMsgs) {
		t.Fatalf("messages %v", several.Messages)
	}
	raw, _ = json.Marshal(several)
	if bytes.Contains(raw, []byte("4111")) {
		t.Fatal("a refusal record carries the payload")
	}
}

// A full record of RefusalsPerRecord entries stays under the 64 KiB the reader accepts.
func TestAFullRefusalRecordStaysBounded(t *testing.T) {
	var entries []refusalEntry
	size := 0
	for i := 0; i < RefusalsPerRecord; i++ {
		e := refusalEntry{"01J" + strconv.Itoa(100000+i) + "ABCDEFGHJKMNPQRSTV", "order-events", "restricted", "orders.created/11@" + strconv.Itoa(1_000_000+i)}
		entries = append(entries, e)
		size += e.bytes()
	}
	r := newRefusalRecord(refusedEnv(t, entries[0].MessageID, "order-events", "restricted"), entries, "internal", "svc-go", "g", time.Now())
	raw, _ := json.Marshal(r)
	if len(raw) > 64*1024 || len(raw) > size+1024 {
		t.Fatalf("a record of %d refusals is %d bytes (entries' bound %d)", RefusalsPerRecord, len(raw), size)
	}
}

// An audited message's id the builder would refuse is left out of the audit envelope's
// correlation id instead of making the audit record unwritable.
func TestAnAuditRecordIsBuiltWhateverIDTheMessageCarries(t *testing.T) {
	c, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Namespace: "n"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := &Subscription{c: c, auditTopic: "prism.audit"}
	for id, kept := range map[string]bool{"m-1": true, strings.Repeat("x", 128): true,
		strings.Repeat("x", 129): false, "a\nb": false} {
		env, value, _, err := s.encodeAudit(map[string]string{"message_id": id}, id)
		if err != nil || len(value) == 0 {
			t.Fatalf("%q: %v", id, err)
		}
		want := ""
		if kept {
			want = id
		}
		if got := env.Header.GetMetadata().GetCorrelationId(); got != want {
			t.Fatalf("%q: correlation id %q", id, got)
		}
	}
}

// A namespace no envelope can carry is refused when the client is created.
func TestANamespaceNoEnvelopeCanCarryIsRefusedAtNew(t *testing.T) {
	for _, ns := range []string{"a\nb", strings.Repeat("n", 250), "\xff"} {
		if _, err := New(Config{Brokers: []string{"127.0.0.1:9"}, Namespace: ns}); err == nil ||
			!strings.Contains(err.Error(), "bad_config: kafka.Config Namespace ") {
			t.Fatalf("%q: %v", ns, err)
		}
	}
}
