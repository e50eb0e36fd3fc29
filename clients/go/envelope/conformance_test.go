package envelope_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"google.golang.org/protobuf/proto"
)

type envelopeVector struct {
	Name            string         `json:"name"`
	Layout          string         `json:"layout"`
	EnvelopeHex     string         `json:"envelope_hex"`
	Canonical       bool           `json:"canonical"`
	Wire            map[string]any `json:"wire"`
	Model           map[string]any `json:"model"`
	Effective       map[string]any `json:"effective"`
	PayloadLocation map[string]any `json:"payload_location"`
}

func layoutOf(name string) envelope.Layout {
	if name == "draft" {
		return envelope.Draft
	}
	return envelope.Reviewed
}

func modelJSON(t *testing.T, env *envelope.Envelope) any {
	t.Helper()
	m, err := conformance.ModelJSON(env)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func envelopeFromModel(t *testing.T, model map[string]any) *envelope.Envelope {
	t.Helper()
	env, err := conformance.EnvelopeFromModel(model)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// TestEnvelopeVectors runs every vector of conformance/envelopes/ (README.md, kind "envelope").
func TestEnvelopeVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "envelope")
	paths, err := conformance.FilesOfKind("envelope")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		raw, err := os.ReadFile(filepath.Join(conformance.Dir(), path))
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Vectors []envelopeVector `json:"vectors"`
		}
		if err := json.Unmarshal(raw, &file); err != nil {
			t.Fatal(err)
		}
		for _, v := range file.Vectors {
			t.Run(v.Name, func(t *testing.T) {
				ran.Ran()
				data, _ := hex.DecodeString(v.EnvelopeHex)
				lay := layoutOf(v.Layout)
				// 1. layout detection
				got, err := envelope.DetectLayout(data)
				if err != nil || got != lay {
					t.Fatalf("layout: got %v, %v; want %v", got, err, lay)
				}
				// 2. the layout's own message
				var wire proto.Message = &reviewedpb.PrismEnvelope{}
				if lay == envelope.Draft {
					wire = &draftpb.PrismEnvelope{}
				}
				if err := proto.Unmarshal(data, wire); err != nil {
					t.Fatal(err)
				}
				if w := conformance.ToJSON(wire.ProtoReflect()); !reflect.DeepEqual(w, conformance.Normalize(v.Wire)) {
					t.Errorf("wire:\n got %v\nwant %v", w, v.Wire)
				}
				// 3. the model, and what a reader derives from it
				env, err := envelope.Decode(data)
				if err != nil {
					t.Fatal(err)
				}
				if env.Payload.Present() && env.Payload.IsParsed() {
					t.Error("Decode parsed the payload; the header-only parse must leave it untouched")
				}
				if m := modelJSON(t, env); !reflect.DeepEqual(m, conformance.Normalize(v.Model)) {
					t.Errorf("model:\n got %v\nwant %v", m, v.Model)
				}
				md := env.Header.GetMetadata()
				eff := conformance.Normalize(map[string]any{"content_type": envelope.ContentType(md),
					"content_encoding": envelope.ContentEncoding(md), "priority": env.Priority()})
				if !reflect.DeepEqual(eff, conformance.Normalize(v.Effective)) {
					t.Errorf("effective: got %v want %v", eff, v.Effective)
				}
				// 4. the payload, found without parsing it
				loc, ok, err := envelope.FindPayload(data, lay)
				if err != nil {
					t.Fatal(err)
				}
				if v.PayloadLocation == nil {
					if ok {
						t.Errorf("payload_location: found %+v, want none", loc)
					}
				} else {
					want := conformance.Normalize(v.PayloadLocation)
					gotLoc := map[string]any{"record_offset": loc.RecordOffset, "record_length": loc.RecordLength,
						"any_offset": loc.AnyOffset, "any_length": loc.AnyLength}
					if loc.ValueOffset >= 0 {
						gotLoc["value_offset"], gotLoc["value_length"] = loc.ValueOffset, loc.ValueLength
					}
					if g := conformance.Normalize(gotLoc); !ok || !reflect.DeepEqual(g, want) {
						t.Errorf("payload_location: got %v want %v", g, want)
					}
				}
				// 5. encode the model in the layout
				built := envelopeFromModel(t, v.Model)
				out, err := envelope.Encode(built, lay)
				if err != nil {
					t.Fatal(err)
				}
				if v.Canonical && !bytes.Equal(out, data) {
					t.Errorf("canonical encoding differs:\n got %x\nwant %x", out, data)
				}
				if !v.Canonical && bytes.Equal(out, data) {
					t.Errorf("a non-canonical input came out unchanged")
				}
				again, err := envelope.Decode(out)
				if err != nil {
					t.Fatal(err)
				}
				if m := modelJSON(t, again); !reflect.DeepEqual(m, conformance.Normalize(v.Model)) {
					t.Errorf("re-decoded model:\n got %v\nwant %v", m, v.Model)
				}
			})
		}
	}
}
