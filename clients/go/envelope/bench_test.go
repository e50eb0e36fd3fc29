package envelope_test

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"google.golang.org/protobuf/proto"
)

// benchEnvelope is a typical envelope (every context set) with a payload of size bytes.
func benchEnvelope(b *testing.B, size int) []byte {
	b.Helper()
	pii := true
	prio := int32(8)
	env, err := envelope.NewBytes("orders.created", "order-events", bytes.Repeat([]byte("x"), size), envelope.Options{
		ContentType: "application/json", Priority: &prio, CorrelationID: "corr-1", DataClassification: "confidential",
		ContainsPII: &pii, Labels: map[string]string{"tier": "gold"}, Extensions: map[string][]byte{"x-tenant": []byte("acme")}})
	if err != nil {
		b.Fatal(err)
	}
	env.Header.Observability.TraceId, env.Header.Observability.SpanId = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	env.Header.Schema = &reviewedpb.SchemaContext{SchemaUrl: "https://registry/v1/subjects/orders.created/versions/3", SchemaVersion: "3"}
	data, err := envelope.Encode(env, envelope.Reviewed)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

var sink string

// BenchmarkMetadataAccess is memo-031's measurement: read the metadata (and every other
// header context) of a received envelope. header-only: Decode, which skips the payload by
// its length prefix; full: proto.Unmarshal of the whole message, which copies the payload.
// BENCHMARKS.md, "Go client".
func BenchmarkMetadataAccess(b *testing.B) {
	for _, size := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20, 10 << 20} {
		data := benchEnvelope(b, size)
		b.Run("header-only/"+strconv.Itoa(size), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				env, err := envelope.Decode(data)
				if err != nil {
					b.Fatal(err)
				}
				h := env.Header
				sink = h.GetMetadata().GetMessageId() + h.GetSecurity().GetDataClassification() + h.GetObservability().GetTraceId() + h.GetSchema().GetSchemaVersion()
			}
		})
		b.Run("full/"+strconv.Itoa(size), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				h := &reviewedpb.PrismEnvelope{}
				if err := proto.Unmarshal(data, h); err != nil {
					b.Fatal(err)
				}
				sink = h.GetMetadata().GetMessageId() + h.GetSecurity().GetDataClassification() + h.GetObservability().GetTraceId() + h.GetSchema().GetSchemaVersion()
			}
		})
	}
}
