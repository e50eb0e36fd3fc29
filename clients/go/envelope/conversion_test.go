package envelope_test

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"google.golang.org/protobuf/proto"
)

type conversionVector struct {
	Name        string         `json:"name"`
	From        string         `json:"from"`
	To          string         `json:"to"`
	InputHex    string         `json:"input_hex"`
	OutputHex   *string        `json:"output_hex"`
	OutputWire  map[string]any `json:"output_wire"`
	OutputModel map[string]any `json:"output_model"`
	NotCarried  []string       `json:"not_carried"`
	// Expected is an error kind the conversion must fail with (map-entries.json)
	Expected string `json:"expected"`
	// SameLayoutHex is what decoding the input and encoding it again in From gives
	SameLayoutHex *string `json:"same_layout_hex"`
}

// TestConversionVectors runs conformance/conversion/ (README.md, kind "conversion").
func TestConversionVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "conversion")
	var file struct {
		Vectors []conversionVector `json:"vectors"`
	}
	paths, err := conformance.FilesOfKind("conversion")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		file.Vectors = nil
		if err := conformance.File(path, &file); err != nil {
			t.Fatal(err)
		}
		runConversion(t, file.Vectors, &ran)
	}
}

func runConversion(t *testing.T, vectors []conversionVector, ran *conformance.Counter) {
	for _, v := range vectors {
		t.Run(v.Name, func(t *testing.T) {
			ran.Ran()
			in, _ := hex.DecodeString(v.InputHex)
			if got, _ := envelope.DetectLayout(in); got != layoutOf(v.From) {
				t.Fatalf("input layout %v, want %s", got, v.From)
			}
			to := layoutOf(v.To)
			if v.SameLayoutHex != nil { // an odd extensions entry stays in its own layout
				env, err := envelope.Decode(in)
				if err != nil {
					t.Fatal(err)
				}
				again, err := envelope.Encode(env, layoutOf(v.From))
				if w, _ := hex.DecodeString(*v.SameLayoutHex); err != nil || !bytes.Equal(again, w) {
					t.Errorf("same layout: got %x (%v)\nwant %s", again, err, *v.SameLayoutHex)
				}
			}
			out, dropped, err := envelope.Convert(in, to)
			if v.Expected != "" {
				if got := conformance.Verdict(err, "converted"); got != v.Expected {
					t.Fatalf("conversion: got %s (%v), want %s", got, err, v.Expected)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			paths := []string{}
			for _, d := range dropped {
				paths = append(paths, strings.SplitN(d, ":", 2)[0])
			}
			sort.Strings(paths)
			want := append([]string{}, v.NotCarried...)
			sort.Strings(want)
			if !reflect.DeepEqual(paths, want) {
				t.Errorf("not carried: got %v, want %v (%q)", paths, want, dropped)
			}
			if v.OutputHex != nil {
				if w, _ := hex.DecodeString(*v.OutputHex); !bytes.Equal(out, w) {
					t.Errorf("output bytes:\n got %x\nwant %s", out, *v.OutputHex)
				}
			}
			var wire proto.Message = &reviewedpb.PrismEnvelope{}
			if to == envelope.Draft {
				wire = &draftpb.PrismEnvelope{}
			}
			if err := proto.Unmarshal(out, wire); err != nil {
				t.Fatal(err)
			}
			if g := conformance.ToJSON(wire.ProtoReflect()); v.OutputWire != nil && !reflect.DeepEqual(g, conformance.Normalize(v.OutputWire)) {
				t.Errorf("output wire:\n got %v\nwant %v", g, v.OutputWire)
			}
			env, err := envelope.Decode(out)
			if err != nil {
				t.Fatal(err)
			}
			if m := modelJSON(t, env); !reflect.DeepEqual(m, conformance.Normalize(v.OutputModel)) {
				t.Errorf("output model:\n got %v\nwant %v", m, v.OutputModel)
			}
		})
	}
}

type negativeVector struct {
	Name     string `json:"name"`
	InputHex string `json:"input_hex"`
	Limits   *struct {
		MaxMessageBytes int `json:"max_message_bytes"`
		MaxHeaderBytes  int `json:"max_header_bytes"`
	} `json:"limits"`
	ExpectedDecode  string         `json:"expected_decode"`
	Model           map[string]any `json:"model"`
	ExpectedPayload string         `json:"expected_payload"`
	PayloadLocation map[string]any `json:"payload_location"`
}

// TestNegativeDecodeVectors runs the decode half of conformance/negative/ (the verify half
// is in the signing package).
func TestNegativeDecodeVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "negative")
	var file struct {
		Vectors []negativeVector `json:"vectors"`
	}
	paths, err := conformance.FilesOfKind("negative")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		if err := conformance.File(path, &file); err != nil {
			t.Fatal(err)
		}
		runNegativeDecode(t, file.Vectors, &ran)
	}
}

func runNegativeDecode(t *testing.T, vectors []negativeVector, ran *conformance.Counter) {
	for _, v := range vectors {
		t.Run(v.Name, func(t *testing.T) {
			ran.Ran()
			in, _ := hex.DecodeString(v.InputHex)
			opts := envelope.DecodeOptions{}
			if v.Limits != nil {
				opts.Limits = &envelope.Limits{MaxMessageBytes: v.Limits.MaxMessageBytes, MaxHeaderBytes: v.Limits.MaxHeaderBytes}
			}
			env, _, err := envelope.DecodeWith(in, opts)
			if got := conformance.Verdict(err, "ok"); got != v.ExpectedDecode {
				t.Fatalf("decode: got %s (%v), want %s", got, err, v.ExpectedDecode)
			}
			if err == nil && v.ExpectedPayload != "" {
				// header-only: the header decodes, the payload is found but only reading it fails
				if env.Payload.IsParsed() {
					t.Fatal("the payload was parsed by Decode")
				}
				if h := conformance.ToJSON(env.Header.ProtoReflect()); !reflect.DeepEqual(h, conformance.Normalize(v.Model)) {
					t.Errorf("header model:\n got %v\nwant %v", h, v.Model)
				}
				_, perr := env.Payload.Value()
				if got := conformance.Verdict(perr, "ok"); got != v.ExpectedPayload {
					t.Errorf("reading the payload: got %s (%v), want %s", got, perr, v.ExpectedPayload)
				}
				loc, ok, lerr := envelope.FindPayload(in, envelope.Auto)
				got := conformance.Normalize(map[string]any{"record_offset": loc.RecordOffset, "record_length": loc.RecordLength,
					"any_offset": loc.AnyOffset, "any_length": loc.AnyLength})
				if lerr != nil || !ok || loc.ValueOffset != -1 || !reflect.DeepEqual(got, conformance.Normalize(v.PayloadLocation)) {
					t.Errorf("payload location: %+v %v %v, want %v", loc, ok, lerr, v.PayloadLocation)
				}
			} else if err == nil {
				if m := modelJSON(t, env); !reflect.DeepEqual(m, conformance.Normalize(v.Model)) {
					t.Errorf("model:\n got %v\nwant %v", m, v.Model)
				}
			}
		})
	}
}
