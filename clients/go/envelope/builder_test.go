package envelope_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

func i32(v int32) *int32 { return &v }
func i64(v int64) *int64 { return &v }

// A field the worker's metadata checks would dead-letter, or proto.Marshal would refuse, is
// refused when the envelope is built, with the field's path (the Python SDK's limits).
func TestBuilderRefusesWhatTheWorkerWouldDeadLetter(t *testing.T) {
	labels := map[string]string{}
	for i := 0; i < 65; i++ {
		labels[strings.Repeat("k", i+1)] = "v"
	}
	for _, c := range []struct {
		name, topic string
		o           envelope.Options
		said        string
	}{
		{"priority", "t", envelope.Options{Priority: i32(11)}, "metadata.priority 11 is outside 0-10"},
		{"ttl", "t", envelope.Options{TTLSeconds: i64(-1)}, "metadata.ttl_seconds must be >= 0"},
		{"long id", "t", envelope.Options{MessageID: strings.Repeat("x", 129)}, "metadata.message_id is 129 characters, over 128"},
		{"not utf-8", "t", envelope.Options{CorrelationID: "\xff"}, "metadata.correlation_id is not valid UTF-8"},
		{"control", "t", envelope.Options{CausalityParent: "a\nb"}, "metadata.causality_parent contains control characters"},
		{"classification", "t", envelope.Options{DataClassification: "topsecret"}, "security.data_classification must be"},
		{"labels", "t", envelope.Options{Labels: labels}, "observability.labels has 65 entries, over 64"},
		{"label length", "t", envelope.Options{Labels: map[string]string{"k": strings.Repeat("v", 256)}}, `observability.labels["k"] is 256 characters, over 255`},
		{"extension key", "t", envelope.Options{Extensions: map[string][]byte{"\xfe": nil}}, "is not valid UTF-8"},
		{"topic", "", envelope.Options{}, "metadata.topic is required"},
		{"topic length", strings.Repeat("t", 250), envelope.Options{}, "metadata.topic is 250 characters, over 249"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := envelope.NewJSON(c.topic, "n", map[string]int{"a": 1}, c.o)
			var pe *prismerr.Error
			if !errors.As(err, &pe) || pe.Code != "invalid_envelope" || !strings.Contains(pe.What, c.said) || pe.Hint == "" {
				t.Fatalf("want invalid_envelope saying %q, got %v", c.said, err)
			}
		})
	}
}

func TestBuilderReportsEveryProblemAtOnce(t *testing.T) {
	_, err := envelope.NewJSON("t", "n", 1, envelope.Options{Priority: i32(-1), TTLSeconds: i64(-1),
		MessageID: "\x00", DataClassification: "x"})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"metadata.priority", "metadata.ttl_seconds", "metadata.message_id", "security.data_classification"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q missing from %v", want, err)
		}
	}
}

// Whatever the strings, the builder either refuses them or builds an envelope that encodes:
// never a proto.Marshal error later, at publish.
func FuzzBuilderStrings(f *testing.F) {
	f.Add("t", "c", "k", "v", int32(5), int64(0))
	f.Add("t\x00", "\xff", "", "v\n", int32(11), int64(-5))
	f.Fuzz(func(t *testing.T, topic, corr, k, v string, prio int32, ttl int64) {
		env, err := envelope.NewJSON(topic, "n", map[string]int{"a": 1}, envelope.Options{
			CorrelationID: corr, Labels: map[string]string{k: v}, Priority: &prio, TTLSeconds: &ttl})
		if err != nil {
			var pe *prismerr.Error
			if !errors.As(err, &pe) || pe.Code != "invalid_envelope" {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		if _, err := envelope.Encode(env, envelope.Reviewed); err != nil {
			t.Fatalf("built but does not encode: %v", err)
		}
	})
}
