package kafka_test

import (
	"encoding/hex"
	"math/rand"
	"strings"
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

// withTracestate is an envelope whose w3c.tracestate extension holds raw.
func withTracestate(raw []byte) *envelope.Envelope {
	env, _ := envelope.NewJSON("orders.created", "order-events", map[string]int{"a": 1}, envelope.Options{
		Extensions: map[string][]byte{"w3c.tracestate": raw}})
	return env
}

// checkFixedPoint: what Tracestate sends is a tracestate it takes back unchanged - ASCII, no
// longer than the input, 1 to 32 members, none empty or padded.
func checkFixedPoint(t *testing.T, raw []byte) {
	t.Helper()
	out := kafka.Tracestate(withTracestate(raw))
	if out == "" {
		return
	}
	if len(out) > len(raw) {
		t.Fatalf("%q: output %q is longer", raw, out)
	}
	if again := kafka.Tracestate(withTracestate([]byte(out))); again != out {
		t.Fatalf("%q: %q re-parses as %q", raw, out, again)
	}
	members := strings.Split(out, ",")
	if len(members) > 32 {
		t.Fatalf("%q: %d members", raw, len(members))
	}
	for _, m := range members {
		if m == "" || strings.Trim(m, " \t") != m || strings.IndexFunc(m, func(r rune) bool { return r > 0x7e || r < 0x20 }) >= 0 {
			t.Fatalf("%q: member %q", raw, m)
		}
	}
}

// FuzzTracestate: any w3c.tracestate bytes (untrusted producer data) give no header or a
// well-formed one; the seeds are the extensions of the conformance vectors.
func FuzzTracestate(f *testing.F) {
	for _, s := range []string{"", "a=1", " a=1 ,,b=2", "a=1,a=2", "é=1", "a=\xff", "t@s=1", strings.Repeat("k=v,", 40)} {
		f.Add([]byte(s))
	}
	paths, err := conformance.FilesOfKind("kafka_headers")
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range paths {
		var file struct {
			Vectors []struct {
				EnvelopeHex string `json:"envelope_hex"`
			} `json:"vectors"`
		}
		if err := conformance.File(path, &file); err != nil {
			f.Fatal(err)
		}
		for _, v := range file.Vectors {
			data, _ := hex.DecodeString(v.EnvelopeHex)
			if env, err := envelope.Decode(data); err == nil {
				if raw, ok := env.Header.GetExtensions()["w3c.tracestate"]; ok {
					f.Add(raw)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkFixedPoint(t, raw) })
}

// TestTracestateOfGrammarMembers: lists of members drawn from the Level 1 grammar, padded
// with spaces and tabs, give the trimmed members joined with "," when the keys are distinct
// and there are 1 to 32 of them, else no header (random bytes rarely reach these paths).
func TestTracestateOfGrammarMembers(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	pick := func(set string, n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			b.WriteByte(set[rng.Intn(len(set))])
		}
		return b.String()
	}
	const lower, keyChars, ows = "abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz0123456789_-*/", " \t"
	var valueChars string
	for c := byte(0x21); c <= 0x7e; c++ {
		if c != ',' && c != '=' {
			valueChars += string(c)
		}
	}
	for i := 0; i < 3000; i++ {
		n := rng.Intn(40)
		var raw, trimmed []string
		keys := map[string]bool{}
		for j := 0; j < n; j++ {
			key := pick(lower, 1) + pick(keyChars, rng.Intn(3))
			if rng.Intn(3) == 0 {
				key += "@" + pick(lower, 1) + pick(keyChars, rng.Intn(3))
			}
			member := key + "=" + pick(valueChars+" ", rng.Intn(4)) + pick(valueChars, 1)
			keys[key] = true
			trimmed = append(trimmed, member)
			raw = append(raw, pick(ows, rng.Intn(3))+member+pick(ows, rng.Intn(3)))
		}
		want := ""
		if n >= 1 && n <= 32 && len(keys) == n {
			want = strings.Join(trimmed, ",")
		}
		in := []byte(strings.Join(raw, ","))
		if got := kafka.Tracestate(withTracestate(in)); got != want {
			t.Fatalf("%q: got %q, want %q", in, got, want)
		}
		checkFixedPoint(t, in)
	}
}
