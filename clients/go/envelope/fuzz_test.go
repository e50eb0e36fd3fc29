package envelope_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// seed adds the conformance suite's inputs, plus a few hand-made hostile ones, as the seed
// corpus: `go test` (and so `make test`) runs every seed; `go test -fuzz=FuzzDecode
// ./envelope` explores from them.
func seed(f *testing.F) {
	seeds, err := conformance.Seeds()
	if err != nil {
		f.Fatal(err)
	}
	if len(seeds) < 50 {
		f.Fatalf("only %d seeds found under conformance/", len(seeds))
	}
	for _, s := range seeds {
		f.Add(s)
	}
	for _, s := range [][]byte{
		{}, {0x00}, {0x08}, {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, {0x0b}, {0x0f},
		{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{0x9a, 0x06, 0x00}, {0x1a, 0x02, 0x0a, 0x80},
		{0x0a, 0x00, 0x12, 0x03, 0x0a, 0x01, 0xff}, // reviewed: security holding invalid UTF-8
	} {
		f.Add(s)
	}
	// compressed payloads, so the fuzzer's mutations reach the gzip, snappy and zstd decoders
	// (FuzzDecode reads every payload with PayloadBytes)
	for _, enc := range []string{"gzip", "snappy", "zstd"} {
		env, err := envelope.NewJSON("orders.created", "order-events", map[string]any{"order_id": 42, "note": strings.Repeat("hello prism ", 40)},
			envelope.Options{ContentEncoding: enc})
		if err != nil {
			f.Fatal(err)
		}
		for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
			b, err := envelope.Encode(env, lay)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
}

// typed fails the test unless err is nil or a *prismerr.Error.
func typed(t *testing.T, what string, err error) {
	t.Helper()
	var pe *prismerr.Error
	if err != nil && !errors.As(err, &pe) {
		t.Fatalf("%s returned an untyped error: %v", what, err)
	}
}

// FuzzDecode: decoding any bytes gives an envelope or a typed error, never a panic; what
// decodes encodes in both layouts, and its lazy payload reads or fails typed.
func FuzzDecode(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := envelope.Decode(data)
		typed(t, "Decode", err)
		if err != nil {
			return
		}
		_, err = env.Payload.Value()
		typed(t, "Payload.Value", err)
		_, err = env.PayloadBytes()
		typed(t, "PayloadBytes", err)
		for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
			out, err := envelope.Encode(env, lay)
			typed(t, "Encode", err)
			if err == nil {
				again, err := envelope.Decode(out)
				typed(t, "Decode(Encode)", err)
				if err == nil && again.Header.GetMetadata().GetMessageId() != env.Header.GetMetadata().GetMessageId() {
					t.Fatalf("message id changed over a %v round trip", lay)
				}
			}
		}
	})
}

// FuzzConvert: converting any bytes to either layout gives bytes or a typed error.
func FuzzConvert(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
			out, _, err := envelope.Convert(data, lay)
			typed(t, "Convert", err)
			if err == nil {
				_, err := envelope.Decode(out)
				typed(t, "Decode(Convert)", err)
			}
		}
	})
}

// FuzzScan: the record walker and the payload locator never panic.
func FuzzScan(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := envelope.Scan(data)
		typed(t, "Scan", err)
		for _, r := range recs {
			if r.Start < 0 || r.End > len(data) || r.ValueStart > r.End {
				t.Fatalf("record out of bounds: %+v (len %d)", r, len(data))
			}
		}
		_, _, err = envelope.FindPayload(data, envelope.Auto)
		typed(t, "FindPayload", err)
	})
}

// TestSizeLimits: the message and header limits reject before any payload byte is read.
func TestSizeLimits(t *testing.T) {
	env, err := envelope.NewBytes("t", "ns", make([]byte, 4096), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := envelope.Encode(env, envelope.Reviewed)
	small := envelope.Limits{MaxMessageBytes: 1024, MaxHeaderBytes: 1024}
	if _, _, err := envelope.DecodeWith(data, envelope.DecodeOptions{Limits: &small}); !errors.Is(err, prismerr.ErrSizeLimit) {
		t.Fatalf("message limit: %v", err)
	}
	tiny := envelope.Limits{MaxMessageBytes: 1 << 20, MaxHeaderBytes: 16}
	if _, _, err := envelope.DecodeWith(data, envelope.DecodeOptions{Limits: &tiny}); !errors.Is(err, prismerr.ErrSizeLimit) {
		t.Fatalf("header limit: %v", err)
	}
	if _, err := envelope.Decode(data); err != nil {
		t.Fatal(err)
	}
}
