package kafka_test

import (
	"encoding/hex"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/kafka"
)

// TestKafkaHeaderVectors runs every vector of conformance/bindings/ (README.md, kind
// "kafka_headers"): the headers Headers writes for a decoded envelope must be exactly the
// Python binding's - names, values and order - so a router or tracing tool reading them
// sees the same message whichever SDK published it.
func TestKafkaHeaderVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "kafka_headers")
	paths, err := conformance.FilesOfKind("kafka_headers")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		var file struct {
			Vectors []struct {
				Name        string      `json:"name"`
				Layout      string      `json:"layout"`
				EnvelopeHex string      `json:"envelope_hex"`
				Headers     [][2]string `json:"headers"`
			} `json:"vectors"`
		}
		if err := conformance.File(path, &file); err != nil {
			t.Fatal(err)
		}
		for _, v := range file.Vectors {
			t.Run(v.Name, func(t *testing.T) {
				ran.Ran()
				data, err := hex.DecodeString(v.EnvelopeHex)
				if err != nil {
					t.Fatal(err)
				}
				layout, err := envelope.DetectLayout(data)
				if err != nil {
					t.Fatal(err)
				}
				if layout.String() != v.Layout {
					t.Fatalf("layout %s, want %s", layout, v.Layout)
				}
				env, err := envelope.Decode(data)
				if err != nil {
					t.Fatal(err)
				}
				var got [][2]string
				for _, h := range kafka.Headers(env, layout) {
					got = append(got, [2]string{h.Key, string(h.Value)})
				}
				if len(got) != len(v.Headers) {
					t.Fatalf("%s %s: headers\n got %q\nwant %q", path, v.Name, got, v.Headers)
				}
				for i := range got {
					if got[i] != v.Headers[i] {
						t.Fatalf("%s %s: header %d is %q, want %q\n got %q\nwant %q", path, v.Name, i, got[i], v.Headers[i], got, v.Headers)
					}
				}
			})
		}
	}
}
