package kafka_test

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/kafka"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
	"github.com/twmb/franz-go/pkg/kgo"
)

func record(t *testing.T, layout envelope.Layout) (*envelope.Envelope, *kgo.Record) {
	t.Helper()
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": 1}, envelope.Options{
		CorrelationID: "c-1", Extensions: map[string][]byte{"w3c.tracestate": []byte("vendor=abc, other=x")}})
	if err != nil {
		t.Fatal(err)
	}
	env.Header.Observability = &reviewedpb.ObservabilityContext{TraceId: "4bf92f3577b34da6a3ce929d0e0e4736", SpanId: "00f067aa0ba902b7", TraceFlags: 1}
	value, err := envelope.Encode(env, layout)
	if err != nil {
		t.Fatal(err)
	}
	return env, kafka.NewRecord("orders.created", env, layout, value, nil)
}

func header(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func TestRecordCarriesTheBindingHeaders(t *testing.T) {
	env, r := record(t, envelope.Draft)
	want := map[string]string{
		"prism-envelope-version": "1", "prism-envelope-layout": "draft", "prism-message-id": env.Header.Metadata.MessageId,
		"prism-topic": "orders.created", "prism-namespace": "order-events", "prism-trace-id": "4bf92f3577b34da6a3ce929d0e0e4736",
		"prism-content-type": "application/json", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate": "vendor=abc,other=x",
	}
	for k, v := range want {
		if got, ok := header(r, k); !ok || got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if string(r.Key) != "c-1" || r.Timestamp.UnixMilli() != env.Header.Metadata.PublishedAtMs {
		t.Errorf("key %q timestamp %v", r.Key, r.Timestamp)
	}
	_, rr := record(t, envelope.Reviewed)
	if _, ok := header(rr, "prism-envelope-version"); ok {
		t.Error("the reviewed layout has no version header")
	}
	got, _, err := kafka.DecodeRecord(r, kafka.DecodeOptions{})
	if err != nil || got.Header.Metadata.MessageId != env.Header.Metadata.MessageId {
		t.Fatalf("decode: %v", err)
	}
}

// TestDecodeRefusesHeadersThatDisagree: each header copy that does not match the envelope,
// a layout header that lies, a tombstone and a tampered signed value are typed errors.
func TestDecodeRefusesHeadersThatDisagree(t *testing.T) {
	mutate := map[string]func(r *kgo.Record){
		"message id": func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "Prism-Message-Id", Value: []byte("other")})
		},
		"layout":            func(r *kgo.Record) { setHeader(r, "prism-envelope-layout", "reviewed") },
		"unknown layout":    func(r *kgo.Record) { setHeader(r, "prism-envelope-layout", "v4") },
		"version":           func(r *kgo.Record) { setHeader(r, "prism-envelope-version", "2") },
		"topic":             func(r *kgo.Record) { setHeader(r, "prism-topic", "orders.deleted") },
		"not utf-8":         func(r *kgo.Record) { setHeader(r, "prism-namespace", "\xff") },
		"tombstone":         func(r *kgo.Record) { r.Value = nil },
		"truncated value":   func(r *kgo.Record) { r.Value = r.Value[:len(r.Value)-3] },
		"not an envelope":   func(r *kgo.Record) { r.Value = []byte{0xff, 0xff, 0xff} },
		"empty header name": func(r *kgo.Record) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: "", Value: nil}) },
	}
	for name, m := range mutate {
		_, r := record(t, envelope.Draft)
		m(r)
		_, _, err := kafka.DecodeRecord(r, kafka.DecodeOptions{})
		var pe *prismerr.Error
		if name == "empty header name" {
			if err != nil {
				t.Errorf("%s: an unrelated header must not matter: %v", name, err)
			}
			continue
		}
		if !errors.As(err, &pe) {
			t.Errorf("%s: want a typed error, got %v", name, err)
		}
	}
	key, _ := signing.NewHMACKey("k", make([]byte, 32))
	env, _ := record(t, envelope.Reviewed)
	value, _ := signing.Sign(env, key, envelope.Reviewed, signing.ScopeV2)
	r := kafka.NewRecord("orders.created", env, envelope.Reviewed, value, nil)
	keys := signing.NewKeys(key.VerificationKey())
	if _, info, err := kafka.DecodeRecord(r, kafka.DecodeOptions{Keys: keys}); err != nil || info.Scope != signing.ScopeV2 {
		t.Fatalf("signed record: %v", err)
	}
	r.Value[len(r.Value)-2] ^= 1
	if _, _, err := kafka.DecodeRecord(r, kafka.DecodeOptions{Keys: keys}); !errors.Is(err, prismerr.ErrSignature) {
		t.Fatalf("tampered signed record: %v", err)
	}
}

func setHeader(r *kgo.Record, name, value string) {
	for i := range r.Headers {
		if r.Headers[i].Key == name {
			r.Headers[i].Value = []byte(value)
			return
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
}

func TestTraceHeadersOnlyWhenValid(t *testing.T) {
	env, _ := envelope.NewBytes("t", "ns", nil, envelope.Options{Extensions: map[string][]byte{"w3c.tracestate": []byte("BAD KEY=1")}})
	env.Header.Observability = &reviewedpb.ObservabilityContext{TraceId: "00000000000000000000000000000000", SpanId: "00f067aa0ba902b7"}
	if kafka.Traceparent(env) != "" || kafka.Tracestate(env) != "" {
		t.Fatal("an all-zero trace id or an invalid tracestate must not be forwarded")
	}
}

func TestLayoutForTopic(t *testing.T) {
	if l, ok := kafka.LayoutForTopic("orders.v2"); !ok || l != envelope.Draft {
		t.Fatal("v2")
	}
	if l, ok := kafka.LayoutForTopic("orders.v3"); !ok || l != envelope.Reviewed {
		t.Fatal("v3")
	}
	if _, ok := kafka.LayoutForTopic("orders"); ok {
		t.Fatal("plain topic")
	}
}

func TestSubscribeConfigIsChecked(t *testing.T) {
	c, err := kafka.New(kafka.Config{Brokers: []string{"127.0.0.1:1"}, Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, cfg := range []kafka.SubscribeConfig{
		{},                                    // no group
		{Group: "g", Clearance: "secret"},     // not a level
		{Group: "g", Clearance: "restricted"}, // audited, no principal
		{Group: "g", Clearance: "internal", AuditTopic: "t"},
	} {
		if _, err := c.Subscribe(t.Context(), "t", cfg); !errors.Is(err, prismerr.ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if _, err := kafka.New(kafka.Config{}); !errors.Is(err, prismerr.ErrConfig) {
		t.Errorf("empty config: %v", err)
	}
}

// FuzzDecodeRecord: any value with any prism-* header values decodes or fails typed.
func FuzzDecodeRecord(f *testing.F) {
	env, _ := envelope.NewJSON("orders.created", "order-events", map[string]int{"a": 1}, envelope.Options{})
	for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
		v, _ := envelope.Encode(env, lay)
		f.Add(v, lay.String(), "1", env.Header.Metadata.MessageId, "orders.created")
	}
	f.Add([]byte{}, "", "", "", "")
	f.Add([]byte{0x0a, 0x00}, "draft", "2", "\xff", "x")
	f.Fuzz(func(t *testing.T, value []byte, layout, version, id, topic string) {
		r := &kgo.Record{Value: value}
		for k, v := range map[string]string{"prism-envelope-layout": layout, "prism-envelope-version": version, "prism-message-id": id, "prism-topic": topic} {
			if v != "" {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
		}
		_, _, err := kafka.DecodeRecord(r, kafka.DecodeOptions{})
		var pe *prismerr.Error
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("untyped error: %v", err)
		}
	})
}

// TestDecodeRecordDetectsTheLayoutWithinTheHeaderLimit: DecodeRecord detected the layout with
// an unbounded walk of the whole value before the bounded decode, so 16 MiB of tiny records
// became 5.6M records (1.2 GB allocated) before the refusal; a truncated last record made it
// answer "truncated" after walking them all. The walk now stops at the header limit.
func TestDecodeRecordDetectsTheLayoutWithinTheHeaderLimit(t *testing.T) {
	value := bytes.Repeat([]byte{0x90, 0x03, 0x00}, envelope.DefaultLimits.MaxMessageBytes/3-2)
	value = append(value, 0x92, 0x03, 0x05) // field 50 claims 5 bytes, none there
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := kafka.DecodeRecord(&kgo.Record{Value: value}, kafka.DecodeOptions{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, prismerr.ErrSizeLimit) {
		t.Fatalf("%v, want a size limit error", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Fatalf("allocated %d MB before refusing", got>>20)
	}
}
