package lnmp_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/lnmp"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// exact re-reads a value through encoding/json with UseNumber: the LNMP vectors hold u64
// values above 2^53, which float64 would round.
func exact(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func fields(t *testing.T, data []byte) (map[string]any, []byte) {
	t.Helper()
	out := map[string]any{}
	var env *lnmp.Envelope
	var record []byte
	if lnmp.IsContainer(data) {
		c, err := lnmp.DecodeContainer(data)
		if err != nil {
			t.Fatal(err)
		}
		out["mode"], out["flags"], out["mode_metadata"] = c.Mode, c.Flags, hex.EncodeToString(c.ModeMetadata)
		env, record = c.Envelope, c.Record
	} else {
		m, err := lnmp.DecodeText(data)
		if err != nil {
			t.Fatal(err)
		}
		env, record = m.Envelope, m.Record
	}
	if env != nil {
		if env.Timestamp != nil {
			out["timestamp"] = *env.Timestamp
		}
		if env.Source != nil {
			out["source"] = *env.Source
		}
		if env.TraceID != nil {
			out["trace_id"] = *env.TraceID
		}
		if env.Sequence != nil {
			out["sequence"] = *env.Sequence
		}
		tlv := []any{}
		for _, x := range env.ExtraTLV {
			tlv = append(tlv, []any{x.Type, hex.EncodeToString(x.Value)})
		}
		keys := []any{}
		for _, kv := range env.ExtraKeys {
			keys = append(keys, []any{kv[0], kv[1]})
		}
		out["extra_tlv"], out["extra_keys"] = tlv, keys
	}
	return out, record
}

// TestLNMPVectors runs every vector of conformance/lnmp/ (README.md, kind "lnmp").
func TestLNMPVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "lnmp")
	paths, err := conformance.FilesOfKind("lnmp")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		raw, err := os.ReadFile(filepath.Join(conformance.Dir(), path))
		if err != nil {
			t.Fatal(err)
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var file struct {
			Vectors []map[string]any `json:"vectors"`
		}
		if err := d.Decode(&file); err != nil {
			t.Fatal(err)
		}
		for _, v := range file.Vectors {
			t.Run(v["name"].(string), func(t *testing.T) {
				ran.Ran()
				data, _ := hex.DecodeString(v["input_hex"].(string))
				env, err := lnmp.ToEnvelope(data)
				if v["expected"] == "bad_lnmp" {
					if !errors.Is(err, prismerr.ErrLNMP) {
						t.Fatalf("want bad_lnmp, got %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				form := "bare"
				if lnmp.IsContainer(data) {
					form = "binary"
				} else if lnmp.HasTextHeader(data) {
					form = "text"
				}
				if form != v["form"] {
					t.Errorf("form %s, want %s", form, v["form"])
				}
				f, record := fields(t, data)
				if got := exact(t, f); !reflect.DeepEqual(got, v["lnmp"]) {
					t.Errorf("lnmp fields:\n got %v\nwant %v", got, v["lnmp"])
				}
				if hex.EncodeToString(record) != v["record_hex"] {
					t.Errorf("record %x, want %s", record, v["record_hex"])
				}
				m, err := conformance.ModelJSON(env)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := exact(t, m), exact(t, v["model"]); !reflect.DeepEqual(got, want) {
					t.Errorf("model:\n got %v\nwant %v", got, want)
				}
				out, err := lnmp.FromEnvelope(env)
				if err != nil {
					t.Fatal(err)
				}
				if hex.EncodeToString(out) != v["reencoded_hex"] {
					t.Errorf("re-encoded:\n got %x\nwant %s", out, v["reencoded_hex"])
				}
			})
		}
	}
}

// FuzzLNMP: any bytes map to an envelope or a bad_lnmp error, and what maps re-encodes.
func FuzzLNMP(f *testing.F) {
	paths, _ := conformance.FilesOfKind("lnmp")
	for _, path := range paths {
		var file struct {
			Vectors []struct {
				InputHex string `json:"input_hex"`
			} `json:"vectors"`
		}
		_ = conformance.File(path, &file)
		for _, v := range file.Vectors {
			b, _ := hex.DecodeString(v.InputHex)
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := lnmp.ToEnvelope(data)
		var pe *prismerr.Error
		if err != nil {
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, err := lnmp.FromEnvelope(env); err != nil && !errors.As(err, &pe) {
			t.Fatalf("untyped error %v", err)
		}
	})
}
